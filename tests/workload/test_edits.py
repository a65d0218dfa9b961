"""workload.edits: each request is classified against its thread's previous request + reply,
and a session may only make the edits it declares."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentcache.errors import PromptError
from agentcache.workload.edits import check_edits, classify
from agentcache.workload.files import load_workload

SYS = {"role": "system", "content": "You are a tool-using assistant."}
U1 = {"role": "user", "content": "List the files."}
A1 = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
}
T1 = {"role": "tool", "tool_call_id": "c1", "content": '["a.py", "b.py"]'}
U2 = {"role": "user", "content": "Open a.py."}
A2 = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": '{"f": "a.py"}'}}
    ],
}
T2 = {"role": "tool", "tool_call_id": "c2", "content": "print('a')"}
U3 = {"role": "user", "content": "Now b.py."}


def turn(*msgs: dict[str, Any], reply: Any = "absent", thread: str = "main") -> dict[str, Any]:
    out: dict[str, Any] = {"messages": list(msgs), "tools": []}
    if reply != "absent":
        out["reply"] = reply
    return out | ({"thread": thread} if thread != "main" else {})


def kinds(turns: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    return [(e.kind, e.changed) for e in classify(turns)]


def test_appending_requests_are_append_edits() -> None:
    turns = [turn(SYS, U1), turn(SYS, U1, A1, T1), turn(SYS, U1, A1, T1, U2)]
    assert kinds(turns) == [("start", ()), ("append", ()), ("append", ())]


def test_a_rewritten_system_prompt_is_a_system_edit() -> None:
    new_sys = {"role": "system", "content": "You are a tool-using assistant.\nTime: 10:01"}
    assert kinds([turn(SYS, U1), turn(new_sys, U1, A1, T1)])[1] == ("system", (0,))


def test_a_replaced_tool_result_is_a_clear_edit() -> None:
    cleared = T1 | {"content": "[cleared]"}
    turns = [turn(SYS, U1, A1, T1, U2), turn(SYS, U1, A1, cleared, U2, A2, T2)]
    assert kinds(turns)[1] == ("clear", (3,))


def test_a_tool_result_without_content_is_compared_as_one() -> None:
    """OpenAI's segmenter takes a tool message with no `content` (an empty result); the edit
    check compares it as such instead of failing on the missing key."""
    empty = {k: v for k, v in T1.items() if k != "content"}
    turns = [turn(SYS, U1, A1, empty, U2), turn(SYS, U1, A1, T1, U2, A2, T2)]
    assert kinds(turns)[1] == ("clear", (3,))


def test_a_span_replaced_by_a_summary_is_a_compact_edit() -> None:
    summary = {"role": "user", "content": "Summary: listed the files, a.py and b.py."}
    turns = [turn(SYS, U1, A1, T1, U2), turn(SYS, summary, U2, A2, T2)]
    assert kinds(turns)[1] == ("compact", (1, 2, 3))


@pytest.mark.parametrize(("last", "changed"), [(U2, ()), (U2 | {"content": "Open b.py."}, (4,))])
def test_a_request_sent_again_without_its_reply_is_a_retry(
    last: dict[str, Any], changed: tuple[int, ...]
) -> None:
    turns = [turn(SYS, U1, A1, T1, U2, reply=None), turn(SYS, U1, A1, T1, last)]
    assert kinds(turns)[1] == ("retry", changed)


def test_a_subagent_sharing_the_system_prompt_and_a_message_is_a_fork() -> None:
    turns = [
        turn(SYS, U1, A1, T1, U2, reply=A2),
        turn(SYS, A1, T1, U3, thread="sub"),  # the parent's exchange, moved to the front
        turn(SYS, U1, A1, T1, U2, A2, T2),  # the parent resumes after its reply
    ]
    assert kinds(turns) == [("start", ()), ("fork", ()), ("append", ())]


def test_a_request_that_is_no_edit_names_its_turn() -> None:
    other = {"role": "system", "content": "Another agent."}
    with pytest.raises(PromptError, match=r"turn 1 \(sub\): the request is no edit"):
        classify([turn(SYS, U1), turn(other, U3, thread="sub")])
    with pytest.raises(PromptError, match=r"turn 1 \(main\)"):
        classify([turn(SYS, U1, reply=None), turn(U1, A1)])  # the system message dropped


def test_a_session_makes_only_the_edits_it_declares() -> None:
    cleared = T1 | {"content": "[cleared]"}
    turns = [turn(SYS, U1, A1, T1, U2), turn(SYS, U1, A1, cleared, U2, A2, T2)]
    assert [e.kind for e in check_edits({"name": "s", "edits": ["clear"], "turns": turns})] == [
        "start",
        "clear",
    ]
    with pytest.raises(
        PromptError,
        match=re.escape(
            "s: turn 1 (main) is a clear edit; the session allows start, append, system"
        ),
    ):
        check_edits({"name": "s", "edits": ["system"], "turns": turns})
    with pytest.raises(PromptError, match="unknown edit kinds"):
        check_edits({"name": "s", "edits": ["rewrite"], "turns": turns})


def test_the_reply_is_read_as_the_bench_reads_it() -> None:
    # no `reply`: the next request's message after this one's, when it is the assistant's
    turns = [turn(SYS, U1), turn(SYS, U1, A1, T1, U2)]
    assert kinds(turns)[1] == ("append", ())
    # an explicit null reply: the next request must extend the request alone
    turns = [turn(SYS, U1, reply=None), turn(SYS, U1, A1, T1, U2)]
    assert kinds(turns)[1] == ("append", ())
    turns = [turn(SYS, U1, reply=A2), turn(SYS, U1, A1, T1, U2)]  # not the reply it names
    with pytest.raises(PromptError, match="turn 1"):
        classify(turns)


def test_the_bench_skips_a_session_that_makes_an_undeclared_edit(tmp_path: Path) -> None:
    cleared = T1 | {"content": "[cleared]"}
    turns = [turn(SYS, U1, A1, T1, U2), turn(SYS, U1, A1, cleared, U2, A2, T2)]
    lines = [{"name": "ok", "edits": ["clear"], "turns": turns},
             {"name": "bad", "edits": ["system"], "turns": turns},
             {"name": "typo", "edits": "clear", "turns": turns},
             {"name": "undeclared", "turns": turns}]  # fmt: skip
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    loaded = load_workload(path)
    # without `edits` a session is not checked: files of one's own keep running as before
    assert [s.name for s in loaded.sessions] == ["ok", "undeclared"]
    assert loaded.problems == (
        f"{path}:2: bad: turn 1 (main) is a clear edit; the session allows start, append, "
        "system; skipped",
        f"{path}:3: typo: 'edits' must be a list of edit kinds; skipped",
    )
