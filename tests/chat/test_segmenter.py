from __future__ import annotations

import pytest

from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.segmenter import ConversationTracker, message_text
from agentcache.errors import PromptError

SYS = ChatMessage("system", "You are an agent.")
TOOL = ToolSpec("ls", "list files", {"type": "object", "properties": {"path": {"type": "string"}}})


def kinds(plan: tuple) -> list[tuple[str, str, bool]]:  # type: ignore[type-arg]
    return [(str(p.kind), p.source, p.changed) for p in plan]


def test_every_message_is_a_fixed_segment_named_by_its_content() -> None:
    t = ConversationTracker()
    first = [SYS, ChatMessage("user", "list the files")]
    p1 = t.segment(first)
    assert kinds(p1.plan) == [("system", "system", False), ("fixed", "message", False)]
    t.record(p1, ChatMessage("assistant", "ls -la"))
    second = [*first, ChatMessage("assistant", "ls -la"), ChatMessage("user", "open README")]
    p2 = t.segment(second, conversation=p1.conversation_id)
    assert kinds(p2.plan) == [("system", "system", False)] + [("fixed", "message", False)] * 3
    assert [p.segment_id for p in p2.plan[:2]] == [p.segment_id for p in p1.plan[:2]]
    reply = t.reply_segment(p1, ChatMessage("assistant", "ls -la"))
    assert (reply.id, reply.scope) == (p2.plan[2].segment_id, p2.history_scope)


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
    assert kinds(p2.plan)[1] == ("fixed", "message", True)
    assert [p.changed for p in p2.plan[2:]] == [False] * 3
    assert [p.segment_id for p in p2.plan[2:]] == [p.segment_id for p in p1.plan[2:]]


def test_edited_histories_keep_every_unchanged_message_id() -> None:
    """Context editing, compaction, retries, a rebuilt list: what is unchanged keeps its id
    (and its scope), wherever it now sits, with or without a token."""
    t = ConversationTracker()
    call = ChatMessage("assistant", "", (ToolCall("c1", "ls", {"path": "."}),))
    turns = [ChatMessage("user", "q1"), call, ChatMessage("tool", "a.py b.py " * 20),
             ChatMessage("assistant", "two files"), ChatMessage("user", "q2")]  # fmt: skip
    base = t.segment([SYS, *turns])
    ids = {pl.message_index: pl.segment_id for pl in base.plan}
    cleared = [*turns[:2], ChatMessage("tool", "[cleared]"), *turns[3:]]
    compacted = [ChatMessage("user", "summary: listed two files"), turns[4]]
    edits = {
        "cleared": ([SYS, *cleared], {0: 0, 1: 1, 2: 2, 4: 4, 5: 5}),
        "compacted": ([SYS, *compacted], {0: 0, 2: 5}),
        "retried": ([SYS, *turns], {i: i for i in range(6)}),
        "memory": ([ChatMessage("system", "memory: x"), *turns], {i: i for i in range(1, 6)}),
    }
    for name, (messages, kept) in edits.items():
        p = t.segment(messages)
        got = {pl.message_index: pl.segment_id for pl in p.plan}
        assert {i: got[i] for i in kept} == {i: ids[j] for i, j in kept.items()}, name
        assert {s.scope for s in p.prompt.segments} == {base.history_scope}, name


def test_tools_become_a_system_segment_after_the_system_messages() -> None:
    p = ConversationTracker().segment([SYS, ChatMessage("user", "x")], [TOOL])
    assert [pl.source for pl in p.plan] == ["system", "tools", "message"]
    assert '"name": "ls"' in p.prompt.segments[1].text
    assert "<tool_call>" in p.prompt.segments[1].text
    no_system = ConversationTracker().segment([ChatMessage("user", "x")], [TOOL])
    assert [pl.source for pl in no_system.plan] == ["tools", "message"]


def test_trailing_assistant_message_is_closed_and_prefill_is_open() -> None:
    t = ConversationTracker()
    p = t.segment([SYS, ChatMessage("user", "x"), ChatMessage("assistant", "partial")])
    assert (p.plan[-1].source, p.plan[-1].kind) == ("generation-prompt", "update")
    p = t.segment([SYS, ChatMessage("user", "x")], prefill="<tool_call>")
    assert (p.plan[-1].source, p.plan[-1].kind) == ("prefill", "update")
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


def test_tool_call_arguments_with_an_integer_past_the_parsers_limit_are_a_prompt_error() -> None:
    call = {"id": "1", "function": {"name": "f", "arguments": '{"a": ' + "9" * 5000 + "}"}}
    with pytest.raises(PromptError) as e:
        ChatMessage.from_openai({"role": "assistant", "tool_calls": [call]})
    assert str(e.value) == (
        "tool call arguments are not valid JSON: Exceeds the limit (4300 digits) for integer "
        "string conversion: value has 5000 digits"
    )


@pytest.mark.parametrize("value", [{1, 2}, object(), b"bytes"], ids=["set", "object", "bytes"])
def test_tool_call_arguments_that_json_cannot_carry_are_prompt_errors(value: object) -> None:
    """From Python (the LangChain model, a hand-built history) arguments can be any value;
    the prompt carries them as JSON, so one JSON has no form for is refused by name."""
    with pytest.raises(PromptError) as e:
        ChatMessage("assistant", "", (ToolCall("c1", "ls", {"path": value}),))
    assert str(e.value).startswith("tool call 'ls': arguments must be JSON values (")


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
    tokens = []
    for i in range(3):
        p = t.segment([ChatMessage("user", f"u{i}")])
        t.record(p, ChatMessage("assistant", "r"))
        tokens.append(p.conversation_id)
    late = t.segment([ChatMessage("user", "v0")], conversation=tokens[0])
    assert not late.plan[0].changed  # conversation 0 was dropped, oldest first
    kept = t.segment([ChatMessage("user", "v2")], conversation=tokens[2])
    assert kept.plan[0].changed
