"""A reply cut by max_tokens inside a forced tool call: its text comes back as content with
finish reason "length", streaming or not, through the stock `openai` client."""

from __future__ import annotations

from typing import Any

import openai

from agentcache.chat.tools import TOOL_CALL_OPEN
from tests.server.conftest import MODEL

TOOL: Any = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}


def test_a_call_cut_by_max_tokens_keeps_its_text(server_url: str) -> None:
    c = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    args: Any = {
        "model": MODEL, "messages": [{"role": "user", "content": "list"}], "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "ls"}}, "max_tokens": 2,
        "temperature": 0,
    }  # fmt: skip
    whole = c.chat.completions.create(**args)
    choice = whole.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert (choice.message.content or "").startswith(TOOL_CALL_OPEN + '\n{"name": "ls"')
    chunks = list(c.chat.completions.create(**args, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == choice.message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
