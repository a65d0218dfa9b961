"""LangChain's standard unit-test suite for chat models."""

from __future__ import annotations

from functools import cache
from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.testing import tiny_model
from langchain_agentcache import ChatAgentCache


@cache
def tiny_engine() -> Engine:
    return Engine(tiny_model(), EngineConfig(kv_pages=256))


class TestChatAgentCacheUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatAgentCache]:
        return ChatAgentCache

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "tiny", "engine": tiny_engine()}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True
