from __future__ import annotations

import pytest

from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.segmenter import ConversationTracker, message_text
from agentcache.errors import PromptError
from agentcache.prompt.segments import SegmentKind

SYS = ChatMessage("system", "You are an agent.")
TOOL = ToolSpec("ls", "list files", {"type": "object", "properties": {"path": {"type": "string"}}})


def kinds(plan: tuple) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(str(p.kind), p.status) for p in plan]


def test_seen_messages_become_fixed_new_ones_update() -> None:
    t = ConversationTracker()
    first = [SYS, ChatMessage("user", "list the files")]
    p1 = t.segment(first)
    assert kinds(p1.plan) == [("system", "system"), ("update", "new")]
    t.record(p1, ChatMessage("assistant", "ls -la"))
    second = [*first, ChatMessage("assistant", "ls -la"), ChatMessage("user", "open README")]
    p2 = t.segment(second)
    assert kinds(p2.plan) == [
        ("system", "system"), ("fixed", "seen"), ("fixed", "seen"), ("update", "new"),
    ]  # fmt: skip
    assert p2.conversation_id == p1.conversation_id  # it extends the last request + reply
    assert [p.segment_id for p in p2.plan[:2]] == [p.segment_id for p in p1.plan[:2]]


def test_fixed_ids_survive_a_changed_message_before_them() -> None:
    t = ConversationTracker()
    memory_v1 = ChatMessage("user", "memory: 1 ticket")
    history = [ChatMessage("user", "q1"), ChatMessage("assistant", "a1")]
    p1 = t.segment([SYS, memory_v1, *history, ChatMessage("user", "q2")])
    t.record(p1, ChatMessage("assistant", "a2"))
    memory_v2 = ChatMessage("user", "memory: 3 tickets, one escalated, one closed")
    p2 = t.segment(
        [SYS, memory_v2, *history, ChatMessage("user", "q2")], conversation=p1.conversation_id
    )
    assert kinds(p2.plan)[1] == ("update", "changed")
    assert [p.kind for p in p2.plan[2:]] == [SegmentKind.FIXED] * 3
    assert [p.segment_id for p in p2.plan[2:]] == [p.segment_id for p in p1.plan[2:]]


def test_conversations_are_kept_apart() -> None:
    t = ConversationTracker()
    a = [SYS, ChatMessage("user", "task A")]
    p = t.segment(a)
    t.record(p, ChatMessage("assistant", "done"))
    b = t.segment([SYS, ChatMessage("user", "task B"), ChatMessage("assistant", "done")])
    assert b.conversation_id != p.conversation_id
    assert kinds(b.plan)[2] == ("update", "new")  # seen only in conversation A


def test_tools_become_a_system_segment_after_the_system_messages() -> None:
    p = ConversationTracker().segment([SYS, ChatMessage("user", "x")], [TOOL])
    assert [pl.status for pl in p.plan] == ["system", "tools", "new"]
    assert '"name": "ls"' in p.prompt.segments[1].text
    assert "<tool_call>" in p.prompt.segments[1].text
    no_system = ConversationTracker().segment([ChatMessage("user", "x")], [TOOL])
    assert [pl.status for pl in no_system.plan] == ["tools", "new"]


def test_trailing_assistant_message_is_closed_and_prefill_is_open() -> None:
    t = ConversationTracker()
    p = t.segment([SYS, ChatMessage("user", "x"), ChatMessage("assistant", "partial")])
    assert p.plan[-1].status == "generation-prompt"
    p = t.segment([SYS, ChatMessage("user", "x")], prefill="<tool_call>")
    assert p.plan[-1].status == "prefill"
    assert p.prompt.segments[-1].role == "assistant"


def test_assistant_tool_calls_render_in_the_documented_format() -> None:
    msg = ChatMessage("assistant", "", (ToolCall("c1", "ls", {"path": "."}),))
    expected = '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    assert message_text(msg) == expected


def test_duplicate_messages_get_distinct_ids() -> None:
    p = ConversationTracker().segment([SYS, ChatMessage("user", "ok"), ChatMessage("user", "ok")])
    ids = [pl.segment_id for pl in p.plan]
    assert len(set(ids)) == len(ids)


def test_bad_messages_are_prompt_errors() -> None:
    with pytest.raises(PromptError, match="wizard"):
        ChatMessage("wizard", "x")
    with pytest.raises(PromptError, match="at least one"):
        ConversationTracker().segment([])
    with pytest.raises(PromptError, match="image_url"):
        ChatMessage.from_openai({"role": "user", "content": [{"type": "image_url"}]})
    assert ChatMessage.from_openai({"role": "user", "content": [{"type": "text", "text": "a"}]})


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ({"role": "user", "content": "ok \ud800"}, "user message content is not valid Unicode"),
        ({"role": "user", "content": [{"type": "text", "text": 5}]}, "'text' must be a string"),
        (
            {"role": "assistant", "tool_calls": [
                {"id": "1", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
            ]},
            "tool call 'f' is not valid Unicode",
        ),
    ],
    ids=["surrogate", "non-string-text-part", "surrogate-in-arguments"],
)  # fmt: skip
def test_message_text_that_cannot_be_tokenized_is_a_prompt_error(
    message: dict[str, object], needle: str
) -> None:
    with pytest.raises(PromptError, match=needle):
        ChatMessage.from_openai(message)


def test_a_tool_with_null_parameters_takes_none() -> None:
    spec = ToolSpec.from_openai(
        {"type": "function", "function": {"name": "now", "parameters": None}}
    )
    assert spec.parameters == {"type": "object", "properties": {}}


def test_tracker_is_bounded() -> None:
    t = ConversationTracker(max_conversations=2)
    for i in range(3):
        p = t.segment([ChatMessage("user", f"u{i}")])
        t.record(p, ChatMessage("assistant", "r"))
    again = t.segment([ChatMessage("user", "u0"), ChatMessage("assistant", "r")])
    assert again.plan[1].status == "new"  # conversation 0 was dropped, oldest first
