"""The server's replies are stored when generated, under the message the client sends back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatEngine
from agentcache.chat.tools import format_tool_call
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import scripted_sampler

PARAMS = GenerationParams(max_new_tokens=128)
TOOL = ToolSpec("ls", "list files", {"type": "object", "properties": {"path": {"type": "string"}}})


CALL = ToolCall("call-1", "ls", {"path": "src"})
CASES: dict[str, tuple[str, tuple[ToolSpec, ...], Callable[[ChatMessage], bool]]] = {
    "text": ("Four.", (), lambda m: m.content == "Four." and not m.tool_calls),
    "tool call": (format_tool_call(CALL), (TOOL,), lambda m: m.tool_calls[0].name == "ls"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_reply_sent_back_is_a_hit(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    text, tools, check = CASES[case]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(text))
    ce = ChatEngine(Engine(tiny, EngineConfig(kv_pages=256)))
    msgs = [ChatMessage("system", "You are terse. " * 4), ChatMessage("user", "What is 2 + 2?")]
    r1 = ce.complete(msgs, PARAMS, tools)
    assert check(r1.message()) and r1.generation.stats.reply_kv == "stored"
    msgs += [r1.message(), ChatMessage("user", "And 3 + 3?")]
    r2 = ce.complete(msgs, PARAMS, tools)
    reply = next(s for s in r2.report.segments if s.message_index == 2)
    assert (reply.status, reply.reason) == ("hit", None)
    assert [s.status for s in r2.report.segments if s.status == "miss"] == []
