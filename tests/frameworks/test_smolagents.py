"""smolagents' `ToolCallingAgent` with its `OpenAIServerModel`, unchanged: chat completions with
`tool_choice="required"` on every step (the agent's own setting) and its long system prompt;
`max_steps` (2) bounds the loop, after which the agent asks once more, without tools, for a final
answer."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("smolagents", reason="needs the frameworks extra (make setup installs it)")

from smolagents import ActionStep, OpenAIServerModel, ToolCallingAgent, tool

from tests.frameworks.conftest import MODEL, STRATEGIES, ReuseLog, Servers, assert_warm_steps_reuse
from tests.frameworks.task import MAX_TOKENS, QUESTION, get_temperature, to_fahrenheit

pytestmark = pytest.mark.slow


def run(base_url: str, log: ReuseLog) -> tuple[Any, list[Any]]:
    http = httpx.Client(event_hooks=log.hooks, timeout=600)  # type: ignore[arg-type]
    model = OpenAIServerModel(
        model_id=MODEL, api_base=base_url, api_key="unused",
        client_kwargs={"http_client": http, "max_retries": 0},
        temperature=0, max_tokens=MAX_TOKENS,
    )  # fmt: skip
    agent = ToolCallingAgent(tools=[tool(get_temperature), tool(to_fahrenheit)], model=model,
                             max_steps=2, verbosity_level=0)  # fmt: skip
    answer = agent.run(QUESTION)
    steps = [(s.model_output, [(c.name, c.arguments) for c in s.tool_calls or []], s.observations)
             for s in agent.memory.steps if isinstance(s, ActionStep)]  # fmt: skip
    return answer, steps


def test_tool_calling_agent_matches_full_and_reuses(servers: Servers) -> None:
    logs = {s: ReuseLog() for s in STRATEGIES}
    runs = {s: run(servers[s].base_url, logs[s]) for s in STRATEGIES}
    assert runs["default"] == runs["full"]
    steps = runs["default"][1]
    # the 135M model's calls often do not parse (smolagents then records the error and goes on)
    assert len(steps) >= 2, steps
    calls = logs["default"].calls("/v1/chat/completions")
    assert all(e.status == 200 for e in calls)
    assert_warm_steps_reuse([e.reused_tokens or 0 for e in calls],
                            [e.prompt_tokens or 0 for e in calls])  # fmt: skip
    assert all(e.reused_tokens == 0 for e in logs["full"].calls("/v1/chat/completions"))
