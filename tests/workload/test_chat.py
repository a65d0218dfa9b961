"""Chat sessions: the bench builds the server's segments for the same requests, stores each
reply's KV as the server does, and skips (with the line number) what the segmenter rejects."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentcache.bench.reuse.harness import BenchRunner, parse_specs
from agentcache.chat import ChatEngine, ChatMessage, ChatRequest, ToolSpec
from agentcache.errors import PromptError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import scripted_sampler
from agentcache.workload.chat import chat_turns
from agentcache.workload.files import Session, load_workload
from tests.bench.reuse.test_bench import turn

SYSTEM = {"role": "system", "content": "You are a terse assistant with tools. " * 3}
TOOL = {"type": "function", "function": {"name": "ls", "description": "list files",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}  # fmt: skip
CALL = {"id": "call_0", "type": "function",
        "function": {"name": "ls", "arguments": json.dumps({"path": "src"})}}  # fmt: skip
MESSAGES: list[dict[str, Any]] = [
    SYSTEM,
    {"role": "user", "content": "What is in src?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": '["a.py", "b.py"]'},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
    {"role": "user", "content": "Which is longer?"},
]
REPLIES = ['<tool_call>\n{"name": "ls", "arguments": {"path": "src"}}\n</tool_call>',
           "Two files: a.py and b.py."]  # fmt: skip


def chat_session() -> list[dict[str, Any]]:
    """Three requests: each ends where the model answers, the next holds its reply."""
    return [{"messages": MESSAGES[:n], "tools": [TOOL], "max_new_tokens": 4} for n in (2, 4, 6)]


class Scopes:
    """Names each scope by its order of first appearance: conversation ids are random, so two
    segmenters agree when their scopes map one to one, consistently across turns."""

    def __init__(self) -> None:
        self.names: dict[str | None, str | None] = {None: None}

    def __call__(self, segs: Sequence[Segment]) -> list[Segment]:
        for s in segs:
            self.names.setdefault(s.scope, f"scope-{len(self.names)}")
        return [replace(s, scope=self.names[s.scope]) for s in segs]


def test_the_bench_builds_the_servers_segments(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = chat_turns(chat_session())
    server = ChatEngine(Engine(tiny, EngineConfig(kv_pages=256)))
    params = GenerationParams(max_new_tokens=128)
    ours_named, server_named = Scopes(), Scopes()
    for i, request in enumerate(chat_session()):
        messages = tuple(ChatMessage.from_openai(m) for m in request["messages"])
        prepared = server.prepare(ChatRequest(messages, params, (ToolSpec.from_openai(TOOL),)))
        got = server_named(prepared.chat.prompt.segments)
        assert got == ours_named(ours[i][0].segments), i
        if i < len(REPLIES):  # the model replies what the next request holds
            monkeypatch.setattr(loop_module, "sample", scripted_sampler(REPLIES[i]))
            result = server.run(prepared)
            reply = server.tracker.reply_segment(prepared.chat, result.message())
            expected = ours[i][1]
            assert expected is not None
            assert server_named([reply]) == ours_named([expected])
            assert result.generation.stats.reply_kv == "stored"
    assert ours[-1][1] is None  # nothing follows the last request
    kinds = [s.kind for s in ours[1][0].segments]
    # the system prompt and tools block, then every message looked up by its content
    assert kinds == [SegmentKind.SYSTEM] * 2 + [SegmentKind.FIXED] * 3


def test_the_bench_stores_each_reply_as_the_server_does(tiny: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"name": "c", "turns": chat_session()}) + "\n")
    session = load_workload(path).sessions[0]
    no_replies = replace(session, turns=tuple(replace(t, reply=None) for t in session.turns))
    runner = BenchRunner(tiny, parse_specs("prefix"), kv_pages=256)

    def reused(s: Session) -> list[int]:
        records = runner.run_session(s, lambda _: None)
        return [r["reused_tokens"] for r in records if r["strategy"] == "prefix"]

    with_replies = runner.run_session(session, lambda _: None)
    prefix = [r for r in with_replies if r["strategy"] == "prefix"]
    assert [r["reply_kv"] for r in prefix] == ["stored", "stored", None]
    # the stored reply extends the exact prefix the next request reuses
    assert all(a > b for a, b in zip(reused(session)[1:], reused(no_replies)[1:], strict=True))


def bad_turns(case: str) -> list[Any]:
    good = chat_session()[0]
    messages: list[Any] = list(good["messages"])
    if case == "role":
        messages[1] = {"role": "robot", "content": "hi"}
    elif case == "content":
        messages[1] = {"role": "user", "content": 7}
    elif case == "not-object":
        messages[1] = "hi"
    elif case == "ends-with-assistant":
        messages.append({"role": "assistant", "content": "Sure"})
    elif case == "tool-calls":
        messages[1:] = [{"role": "assistant", "tool_calls": ["ls"]}, MESSAGES[1]]
    elif case == "empty":
        messages = []
    elif case == "mixed":
        return [{**good, "messages": messages}, turn("x")]
    tools: Any = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "x"}}}]
    return [{**good, "messages": messages, **({"tools": tools} if case == "schema" else {})}]


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("role", "turn 0: messages[1]: unknown message role 'robot'"),
        ("content", "turn 0: messages[1]: message content must be text or a list of parts"),
        ("not-object", "turn 0: messages[1] must be an object, got str"),
        ("ends-with-assistant", "turn 0: the last message is the assistant's"),
        ("tool-calls", "turn 0: messages[1] is malformed ("),
        ("empty", "turn 0: 'messages' must not be empty"),
        ("schema", "turn 0: tools[0]: tool 'ls' parameters.type: 'x' is not a JSON Schema type"),
        ("mixed", "a session's turns are all 'messages' lists or none is"),
    ],
)
def test_messages_the_segmenter_rejects_skip_the_line(
    tmp_path: Path, case: str, needle: str
) -> None:
    path = tmp_path / "chat.jsonl"
    good = json.dumps({"name": "ok", "turns": chat_session()})
    path.write_text(good + "\n" + json.dumps({"name": "bad", "turns": bad_turns(case)}) + "\n")
    loaded = load_workload(path)
    assert [s.name for s in loaded.sessions] == ["ok"]
    assert len(loaded.problems) == 1 and loaded.problems[0].startswith(f"{path}:2: ")
    assert needle in loaded.problems[0] and loaded.problems[0].endswith("; skipped")


def test_a_turn_that_names_its_reply_records_that_reply() -> None:
    # a retry: the first request's reply was dropped, the second is the same request again
    turns = chat_session()
    dropped = [{**turns[1], "reply": None}, turns[1], turns[2]]
    prompts = chat_turns(dropped)
    assert prompts[0][1] is None and prompts[1][1] is not None
    # a subagent's request between a request and its continuation: the reply is named
    sub = {"messages": [SYSTEM, {"role": "user", "content": "List docs."}], "tools": [TOOL]}
    named = [{**turns[0], "reply": MESSAGES[2]}, sub, turns[1]]
    got, want = chat_turns(named)[0][1], chat_turns(turns)[0][1]
    assert got is not None and want is not None
    assert replace(got, scope=None) == replace(want, scope=None)  # scopes: random conversation ids
    assert chat_turns([turns[0], sub, turns[1]])[0][1] is None  # read from the next request


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ({"role": "user", "content": "hi"}, "turn 0: 'reply' must be an assistant message"),
        ("hi", "turn 0: reply[0] must be an object, got str"),
    ],
)
def test_a_reply_that_is_not_an_assistant_message_is_an_error(reply: Any, needle: str) -> None:
    with pytest.raises(PromptError, match=re.escape(needle)):
        chat_turns([{**chat_session()[0], "reply": reply}])
