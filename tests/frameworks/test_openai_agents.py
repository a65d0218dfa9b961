"""OpenAI Agents SDK with its default settings: `POST /v1/responses`, function tools, the SDK's
own run loop, two runs of one conversation (the second resends the first's items, as
`to_input_list()` is meant for). Each run's step is forced to call get_temperature (a named
`tool_choice`) and the run stops at that tool's output (`tool_use_behavior`), so no run ends on
a free-text reply the 135M model would stretch past `max_output_tokens`, which the SDK raises
on."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("agents", reason="needs the frameworks extra (make setup installs it)")

from agents import Agent, ModelSettings, RunConfig, Runner, RunResult, function_tool
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

from tests.frameworks.conftest import (
    MODEL,
    STRATEGIES,
    ReuseLog,
    Servers,
    assert_warm_steps_reuse,
)
from tests.frameworks.task import (
    FOLLOW_UP,
    INSTRUCTIONS,
    MAX_TOKENS,
    QUESTION,
    get_temperature,
    to_fahrenheit,
)

pytestmark = pytest.mark.slow


def run(base_url: str, log: ReuseLog) -> list[RunResult]:
    http = httpx.AsyncClient(event_hooks=log.async_hooks, timeout=600)  # type: ignore[arg-type]
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    agent = Agent(
        name="meteo",
        instructions=INSTRUCTIONS,
        tools=[function_tool(get_temperature), function_tool(to_fahrenheit)],
        model=MODEL,
        model_settings=ModelSettings(tool_choice="get_temperature", temperature=0,
                                     max_tokens=MAX_TOKENS),
        tool_use_behavior="stop_on_first_tool",
    )  # fmt: skip
    # the provider's defaults: the Responses API, as with no provider at all
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
    first = Runner.run_sync(agent, QUESTION, max_turns=2, run_config=config)
    again = [*first.to_input_list(), {"role": "user", "content": FOLLOW_UP}]
    return [first, Runner.run_sync(agent, again, max_turns=2, run_config=config)]


def transcript(results: list[RunResult]) -> list[Any]:
    """The run's items without the ids the server draws at random."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("id", "call_id")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return [strip(item) for item in results[-1].to_input_list()]


def test_agents_sdk_default_settings_matches_full_and_reuses(servers: Servers) -> None:
    logs = {s: ReuseLog() for s in STRATEGIES}
    results = {s: run(servers[s].base_url, logs[s]) for s in STRATEGIES}
    assert transcript(results["default"]) == transcript(results["full"])
    items = results["default"][-1].to_input_list()
    calls = [i["name"] for i in items if i.get("type") == "function_call"]
    assert calls == ["get_temperature", "get_temperature"], items
    assert [e.path for e in logs["default"].exchanges] == ["/v1/responses"] * 2
    usage = [r.usage for run in results["default"] for r in run.raw_responses]
    cached = [u.input_tokens_details.cached_tokens for u in usage]
    assert_warm_steps_reuse(cached, [u.input_tokens for u in usage])
    assert cached == [e.reused_tokens for e in logs["default"].exchanges]
    assert all(e.reused_tokens == 0 for e in logs["full"].exchanges)
