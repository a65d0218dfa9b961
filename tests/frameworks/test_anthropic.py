"""The `anthropic` SDK's tool-use loop against `POST /v1/messages`: a system block with a
`cache_control` breakpoint, two tools each forced in turn (`tool_choice` naming it), then an
answer with `tool_choice: none`; the SDK's usage reports `cache_read_input_tokens`. Skipped
while the server does not serve /v1/messages (it answers 404)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("anthropic", reason="needs the frameworks extra (make setup installs it)")

import anthropic

from tests.frameworks.conftest import MODEL, STRATEGIES, Servers, assert_warm_steps_reuse
from tests.frameworks.task import (
    INSTRUCTIONS,
    MAX_TOKENS,
    QUESTION,
    TOOL_NAMES,
    get_temperature,
    to_fahrenheit,
)

pytestmark = pytest.mark.slow
TOOLS: list[dict[str, Any]] = [
    {"name": "get_temperature", "description": "Get a city's temperature in degrees Celsius.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}},
    {"name": "to_fahrenheit", "description": "Convert degrees Celsius to degrees Fahrenheit.",
     "input_schema": {"type": "object", "properties": {"celsius": {"type": "number"}},
                      "required": ["celsius"]}},
]  # fmt: skip
RUN = {"get_temperature": get_temperature, "to_fahrenheit": to_fahrenheit}


@pytest.fixture(scope="module")
def messages_served(servers: Servers) -> None:
    if httpx.post(f"{servers.default.url}/v1/messages", json={}, timeout=30).status_code == 404:
        pytest.skip("the server does not serve POST /v1/messages yet")


def call(use_id: str, name: str, args: Any) -> dict[str, Any]:
    """A tool_result block; arguments the tool does not take (the small model often writes the
    tool's schema as its input) come back as an error result, as frameworks do."""
    try:
        return {"type": "tool_result", "tool_use_id": use_id, "content": RUN[name](**args)}
    except TypeError as e:
        return {"type": "tool_result", "tool_use_id": use_id, "content": str(e), "is_error": True}


def run(root_url: str) -> list[Any]:
    # the SDK's own HTTP client (it refuses an `httpx` one); reuse is read from its usage
    client = anthropic.Anthropic(base_url=root_url, api_key="unused", max_retries=0, timeout=600)
    system = [{"type": "text", "text": INSTRUCTIONS, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    replies = []
    for step in range(len(TOOL_NAMES) + 1):
        choice = ({"type": "tool", "name": TOOL_NAMES[step]} if step < len(TOOL_NAMES)
                  else {"type": "none"})  # fmt: skip
        reply = client.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, extra_body={"temperature": 0},  # no SDK argument
            system=system,  # type: ignore[arg-type]
            tools=TOOLS, tool_choice=choice, messages=messages,  # type: ignore[arg-type]
        )  # fmt: skip
        replies.append(reply)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                          for b in reply.content]})  # fmt: skip
        results = [call(b.id, b.name, b.input) for b in reply.content if b.type == "tool_use"]
        if results:
            messages.append({"role": "user", "content": results})
    return replies


def said(replies: list[Any]) -> list[Any]:
    """Each reply's blocks without the random tool_use ids, and why it stopped."""
    return [([b.model_dump(exclude={"id"}) for b in r.content], r.stop_reason) for r in replies]


@pytest.mark.usefixtures("messages_served")
def test_anthropic_tool_loop_matches_full_and_reuses(servers: Servers) -> None:
    runs = {s: run(servers[s].url) for s in STRATEGIES}
    assert said(runs["default"]) == said(runs["full"])
    names = [[b.name for b in r.content if b.type == "tool_use"] for r in runs["default"]]
    assert names == [["get_temperature"], ["to_fahrenheit"], []]
    usage = [r.usage for r in runs["default"]]
    # Anthropic's input_tokens counts the prompt tokens after the last cache read
    assert_warm_steps_reuse([u.cache_read_input_tokens or 0 for u in usage])
    assert all(not r.usage.cache_read_input_tokens for r in runs["full"])
