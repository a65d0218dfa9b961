"""LangGraph's prebuilt ReAct agent (`create_react_agent`), unchanged, on two chat models: our
`ChatAgentCache` (the engine in this process) and `ChatOpenAI(base_url=...)` against the server.
The agent picks its model per step (a callable model), which forces the 135M model through the
task: get_temperature, then to_fahrenheit, then an answer without tools."""

from __future__ import annotations

import warnings
from typing import Any

import httpx
import pytest

pytest.importorskip("langchain_openai", reason="needs the frameworks extra (make setup)")

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI

from agentcache.model.loading import load_model
from agentcache.runtime.engine import Engine, EngineConfig
from langchain_agentcache import ChatAgentCache
from tests.frameworks.conftest import (
    MODEL,
    STRATEGIES,
    ReuseLog,
    Servers,
    assert_warm_steps_reuse,
)
from tests.frameworks.task import (
    INSTRUCTIONS,
    MAX_TOKENS,
    QUESTION,
    TOOL_NAMES,
    get_temperature,
    to_fahrenheit,
)

with warnings.catch_warnings():  # moved to langchain.agents.create_agent; still LangGraph's own
    warnings.simplefilter("ignore", DeprecationWarning)
    from langgraph.prebuilt import create_react_agent

pytestmark = pytest.mark.slow
# short descriptions: the 135M model copies the tools' listing into a forced call's arguments,
# and with the docstrings' "Args:" sections it does not close the call's JSON in MAX_TOKENS
TOOLS = [
    StructuredTool.from_function(get_temperature, description="Get a city's temperature in C."),
    StructuredTool.from_function(to_fahrenheit, description="Convert Celsius to Fahrenheit."),
]


def react(chat: BaseChatModel) -> list[BaseMessage]:
    def pick(state: dict[str, Any], runtime: Any) -> Any:
        done = sum(isinstance(m, ToolMessage) for m in state["messages"])
        if done < len(TOOL_NAMES):  # the next tool of the task, forced
            return chat.bind_tools(TOOLS, tool_choice=TOOL_NAMES[done])
        return chat.bind_tools(TOOLS, tool_choice="none")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        agent = create_react_agent(pick, TOOLS, prompt=INSTRUCTIONS)
    out = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 10})
    return list(out["messages"])


def replies(messages: list[BaseMessage]) -> list[tuple[str, Any]]:
    """What the model said at each step (text and calls, without the random call ids)."""
    return [(str(m.content), [(c["name"], c["args"]) for c in m.tool_calls])
            for m in messages if isinstance(m, AIMessage)]  # fmt: skip


def check(runs: dict[str, list[BaseMessage]]) -> list[AIMessage]:
    assert replies(runs["default"]) == replies(runs["full"])
    steps = [m for m in runs["default"] if isinstance(m, AIMessage)]
    # what the 135M model writes decides how far the loop gets: the forced first call is parsed,
    # and the loop goes on at least one step after it
    assert len(steps) >= 2 and [c["name"] for c in steps[0].tool_calls] == ["get_temperature"]
    return steps


def cache_read(m: AIMessage) -> int:
    assert m.usage_metadata is not None
    return int(m.usage_metadata.get("input_token_details", {}).get("cache_read", 0))


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    model = load_model()
    return {"default": Engine(model, EngineConfig()),
            "full": Engine(model, EngineConfig(strategy="full"))}  # fmt: skip


def test_react_agent_on_chat_agentcache(engines: dict[str, Engine]) -> None:
    def chat(s: str) -> ChatAgentCache:
        return ChatAgentCache(engine=engines[s], max_tokens=MAX_TOKENS)

    steps = check({s: react(chat(s)) for s in STRATEGIES})
    assert_warm_steps_reuse([cache_read(m) for m in steps],
                            [m.usage_metadata["input_tokens"] for m in steps])  # type: ignore[index]  # fmt: skip


def test_react_agent_on_chat_openai(servers: Servers) -> None:
    logs = {s: ReuseLog() for s in STRATEGIES}

    def chat(s: str) -> ChatOpenAI:
        http = httpx.Client(event_hooks=logs[s].hooks, timeout=600)  # type: ignore[arg-type]
        return ChatOpenAI(model=MODEL, base_url=servers[s].base_url, api_key="unused",
                          temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
                          http_client=http)  # fmt: skip

    steps = check({s: react(chat(s)) for s in STRATEGIES})
    cached = [cache_read(m) for m in steps]
    assert_warm_steps_reuse(cached, [m.usage_metadata["input_tokens"] for m in steps])  # type: ignore[index]
    assert cached == [e.reused_tokens for e in logs["default"].calls("/v1/chat/completions")]
