from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from agentcache.model.loading import LoadedModel
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread

MODEL = "tiny"


def tiny_app(
    model: LoadedModel, strategy: str = DEFAULT_STRATEGY, kv_pages: int = 512, **config: Any
) -> FastAPI:
    engine = Engine(model, EngineConfig(strategy=strategy, kv_pages=kv_pages))
    return create_app(engine, ServerConfig(MODEL, default_max_tokens=8, **config))


@pytest.fixture
def server_url(tiny: LoadedModel) -> Iterator[str]:
    with serve_in_thread(tiny_app(tiny)) as url:
        yield url
