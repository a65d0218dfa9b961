"""pydantic-ai's `Agent` on its own `OpenAIChatModel` and `OpenAIProvider` (chat completions,
function tools), in two output modes:

- the default for a model type (a tool output: a `final_result` tool), two runs of one
  conversation (the second passes the first's messages as `message_history`);
- `NativeOutput`: the schema as `response_format` `json_schema`, which the server enforces.

Each step's tool is named by a per-step `tool_choice` (an agent-level callable `model_settings`,
which pydantic-ai accepts for tools forced step by step). pydantic-ai marks the tools `strict`,
so the server decodes a named call to the tool's schema and the 135M model's arguments always
validate. The last step names `final_result`, or, under `NativeOutput`, sets `"none"` so the
reply is the schema's JSON."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

pytest.importorskip("pydantic_ai", reason="needs the frameworks extra (make setup installs it)")

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, AgentRunResult, NativeOutput, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings, ToolChoice

from tests.frameworks.conftest import MODEL, STRATEGIES, ReuseLog, Servers, assert_warm_steps_reuse
from tests.frameworks.task import (
    FOLLOW_UP,
    INSTRUCTIONS,
    MAX_TOKENS,
    QUESTION,
    get_temperature,
    to_fahrenheit,
)

pytestmark = pytest.mark.slow

FORCED = {1: "get_temperature", 2: "to_fahrenheit"}  # a run's step -> the tool it calls


class Report(BaseModel):
    city: str
    celsius: float
    fahrenheit: float


def settings(last: ToolChoice) -> Callable[[RunContext[None]], ModelSettings]:
    """Each step's settings: the step's tool, then `last` once both tools were called."""

    def for_step(ctx: RunContext[None]) -> ModelSettings:
        choice = [FORCED[ctx.run_step]] if ctx.run_step in FORCED else last
        return ModelSettings(temperature=0, max_tokens=MAX_TOKENS, tool_choice=choice)

    return for_step


def run(base_url: str, native: bool, log: ReuseLog, turns: int) -> list[AgentRunResult[Report]]:
    http = httpx.AsyncClient(event_hooks=log.async_hooks, timeout=600)  # type: ignore[arg-type]
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model,
        instructions=INSTRUCTIONS,
        tools=[get_temperature, to_fahrenheit],
        output_type=NativeOutput(Report) if native else Report,
        model_settings=settings("none" if native else ["final_result"]),
    )
    results = [agent.run_sync(QUESTION)]
    for _ in range(turns - 1):
        results.append(agent.run_sync(FOLLOW_UP, message_history=results[-1].all_messages()))
    return results


def transcript(messages: Sequence[ModelMessage]) -> list[Any]:
    """What was said, without the timestamps, ids and usage of each message."""

    def part(p: Any) -> tuple[Any, ...]:
        if p.part_kind == "tool-call":
            return p.part_kind, p.tool_name, p.args_as_dict()
        return p.part_kind, getattr(p, "tool_name", None), p.content

    return [(m.kind, [part(p) for p in m.parts]) for m in messages]


def responses(results: list[AgentRunResult[Report]]) -> list[ModelResponse]:
    return [m for m in results[-1].all_messages() if isinstance(m, ModelResponse)]


def assert_reuse_reported(replies: list[ModelResponse], logs: dict[str, ReuseLog]) -> None:
    """Warm steps report cached tokens, the same the server's headers report; full none."""
    exchanges = logs["default"].exchanges
    assert [e.path for e in exchanges] == ["/v1/chat/completions"] * len(replies)
    assert all(e.status == 200 for e in exchanges)
    cached = [m.usage.cache_read_tokens for m in replies]
    assert_warm_steps_reuse(cached, [m.usage.input_tokens for m in replies])
    assert cached == [e.reused_tokens for e in exchanges]
    assert all(e.reused_tokens == 0 for e in logs["full"].exchanges)


def test_tool_output_matches_full_and_reuses(servers: Servers) -> None:
    logs = {s: ReuseLog() for s in STRATEGIES}
    results = {s: run(servers[s].base_url, False, logs[s], turns=2) for s in STRATEGIES}
    said = {s: transcript(results[s][-1].all_messages()) for s in STRATEGIES}
    assert said["default"] == said["full"]
    assert [r.output for r in results["default"]] == [r.output for r in results["full"]]
    replies = responses(results["default"])
    calls = [p.tool_name for m in replies for p in m.tool_calls]
    assert calls == ["get_temperature", "to_fahrenheit", "final_result"] * 2, said["default"]
    assert_reuse_reported(replies, logs)


def test_native_output_matches_full_and_reuses(servers: Servers) -> None:
    """The last step sends `tool_choice="none"`, under which the server still renders the
    tools (as vLLM does) and parses no call: its prompt extends the step before, whose prompt
    it reuses whole as an exact prefix, and the whole run equals full's."""
    logs = {s: ReuseLog() for s in STRATEGIES}
    results = {s: run(servers[s].base_url, True, logs[s], turns=1) for s in STRATEGIES}
    replies = {s: responses(results[s]) for s in STRATEGIES}
    said = {s: transcript(results[s][-1].all_messages()) for s in STRATEGIES}
    assert said["default"] == said["full"]
    assert results["default"][-1].output == results["full"][-1].output
    calls = [p.tool_name for m in replies["default"] for p in m.tool_calls]
    assert calls == ["get_temperature", "to_fahrenheit"], said["default"]
    for s in STRATEGIES:  # the final reply is text, the schema's JSON
        last = replies[s][-1]
        assert len(replies[s]) == 3 and not last.tool_calls, transcript(replies[s])
        assert Report.model_validate_json(last.text or "") == results[s][-1].output
    assert_reuse_reported(replies["default"], logs)
    before = replies["default"][-2].usage.input_tokens  # the last tool step's prompt
    assert logs["default"].exchanges[-1].reused_tokens >= before
