"""The server's replies are stored when generated, under the message the client sends back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatEngine
from agentcache.chat.tools import forced_call_prefix, format_tool_call
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
    assert [s.message_index for s in r2.report.misses] == [3]  # only the new user message


def test_a_forced_call_sent_back_is_a_hit(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call forced by tool_choice: the reply starts with the call's opening as a prefill and
    the model writes the rest. Its KV (the prefill's and the generated tokens') is stored under
    the message the client sends back with the tool's result, as a free call's is."""
    prefill = forced_call_prefix("ls")
    call = format_tool_call(CALL)
    assert call.startswith(prefill)
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(call[len(prefill) :]))
    ce = ChatEngine(Engine(tiny, EngineConfig(kv_pages=256)))
    msgs = [ChatMessage("system", "You are terse. " * 4), ChatMessage("user", "List src.")]
    r1 = ce.complete(msgs, PARAMS, (TOOL,), prefill=prefill)
    assert [(c.name, dict(c.arguments)) for c in r1.tool_calls] == [("ls", {"path": "src"})]
    assert r1.generation.stats.reply_kv == "stored"
    msgs += [r1.message(), ChatMessage("tool", "a.py b.py", tool_call_id=r1.tool_calls[0].id)]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler("Two files."))
    r2 = ce.complete(msgs, PARAMS, (TOOL,))
    reply = next(s for s in r2.report.segments if s.message_index == 2)
    assert (reply.status, reply.reason) == ("hit", None)
    assert reply.exact_tokens == reply.num_tokens > len(call)  # the call's bytes and markup
    assert [s.message_index for s in r2.report.misses] == [3]  # only the tool's result is new
