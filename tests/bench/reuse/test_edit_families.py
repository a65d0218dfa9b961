"""bench.reuse.edit_families on a small tool-use conversation: each family makes the edits it
declares, every request ends where the model must answer, and the server's segmenter takes it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentcache.bench.reuse.edit_families import (
    FAMILIES,
    PLACEHOLDER,
    SUMMARY_HEAD,
    ToolConversation,
)
from agentcache.workload.chat import chat_turns
from agentcache.workload.edits import check_edits

TOOL = {
    "type": "function",
    "function": {
        "name": "ls",
        "description": "list a folder",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
}


def conversation(calls_per_request: tuple[int, ...] = (2, 1, 3, 2)) -> ToolConversation:
    """User requests with their calls and results; request u names folder u."""
    body: list[dict[str, Any]] = []
    points, variants = [], {}
    for u, n in enumerate(calls_per_request):
        if u == 3:
            variants[len(body)] = "List one of the folders."  # an under-specified phrasing
        body.append({"role": "user", "content": f"List folder f{u} and its subfolders."})
        for _ in range(n):
            s = len(points)
            points.append(len(body))
            args = json.dumps({"path": f"f{u}/{s}"})
            body.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": f"call_{s}",
                            "type": "function",
                            "function": {"name": "ls", "arguments": args},
                        }
                    ],
                }
            )
            body.append({"role": "tool", "tool_call_id": f"call_{s}", "content": f'["x{s}.txt"]'})
    states = tuple(f'{{"cwd": "f{s}"}}' for s in range(len(points)))
    return ToolConversation(
        "You list folders.", (TOOL,), tuple(body), tuple(points), states, variants
    )


def session(family: str, mode: str, conv: ToolConversation) -> dict[str, Any]:
    requests = FAMILIES[family].make(conv, mode)
    assert requests is not None
    return {
        "name": family,
        "edits": list(FAMILIES[family].edits),
        "turns": [r.to_json() for r in requests],
    }


CASES = [(family, mode) for family, spec in FAMILIES.items() for mode in spec.modes]


@pytest.mark.parametrize(("family", "mode"), CASES)
def test_each_family_makes_its_edits_and_ends_where_the_model_answers(
    family: str, mode: str
) -> None:
    sess = session(family, mode, conversation())
    kinds = [e.kind for e in check_edits(sess)]
    assert set(FAMILIES[family].edits) <= set(kinds), kinds
    assert len(sess["turns"]) >= 6
    assert all(t["messages"][-1]["role"] in ("user", "tool") for t in sess["turns"])
    assert len(chat_turns(sess["turns"])) == len(sess["turns"])


def test_sysprompt_changes_only_the_end_of_the_system_message() -> None:
    for mode in ("memory", "clock"):
        systems = [
            t["messages"][0]["content"]
            for t in session("chat-sysprompt", mode, conversation())["turns"]
        ]
        assert len(set(systems)) == len(systems) and all(
            s.startswith("You list folders.\n\n") for s in systems
        )


def test_edit_keeps_the_newest_two_results_and_clears_the_rest() -> None:
    last = session("chat-edit", "rolling", conversation())["turns"][-1]["messages"]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert results[-2:] != [PLACEHOLDER] * 2 and set(results[:-2]) == {PLACEHOLDER}


def test_compact_once_cuts_at_the_fourth_turn() -> None:
    turns = session("chat-compact", "once", conversation())["turns"]
    heads = [t["messages"][1]["content"].startswith(SUMMARY_HEAD) for t in turns]
    assert heads == [False, False, False, True, True, True]


def test_retry_edit_sends_the_under_specified_phrasing_first() -> None:
    turns = session("chat-retry", "edit", conversation())["turns"]
    firsts = [i for i, t in enumerate(turns) if t["messages"][-1]["content"].startswith("List one")]
    assert len(firsts) == 1
    i = firsts[0]
    assert turns[i]["reply"] is None
    assert turns[i + 1]["messages"][-1]["content"] == "List folder f3 and its subfolders."


def test_fork_runs_the_subagent_between_the_parents_turns() -> None:
    turns = session("chat-fork", "delegate", conversation())["turns"]
    threads = [t.get("thread", "main") for t in turns]
    first_sub = threads.index("subagent")
    assert "main" in threads[:first_sub] and threads[-1] == "main"
    assert turns[first_sub]["tools"] == turns[0]["tools"]
    report = [m for m in turns[-1]["messages"] if m.get("tool_call_id") == "call_subagent"]
    assert len(report) == 1 and report[0]["content"].startswith("Report: ls(")


@pytest.mark.parametrize(("family", "mode"), CASES)
def test_a_conversation_too_short_for_a_family_gives_none(family: str, mode: str) -> None:
    assert FAMILIES[family].make(conversation((1, 1, 1)), mode) is None


def test_an_unknown_case_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown case 'daily'; expected one of memory, clock"):
        FAMILIES["chat-sysprompt"].make(conversation(), "daily")
