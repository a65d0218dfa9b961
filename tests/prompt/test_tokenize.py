from __future__ import annotations

import pytest

from agentcache.errors import ContextLengthError, PromptError
from agentcache.model.tokenizer import CHATML, LLAMA3, PLAIN, ByteTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import GENERATION_PROMPT_ID, tokenize_prompt

TOK = ByteTokenizer()
SYS = Segment(SegmentKind.SYSTEM, "You are terse.", "sys", "system")
HIST_U = Segment(SegmentKind.FIXED, "What is 2+2?", "u0", "user")
HIST_A = Segment(SegmentKind.FIXED, "4", "a0", "assistant")
NEW_U = Segment(SegmentKind.UPDATE, "And 3+3?", "u1", "user")


def enc(text: str) -> tuple[int, ...]:
    return tuple(TOK.encode(text))


def test_segments_tokenize_independently_of_neighbours() -> None:
    prompt = SegmentedPrompt([SYS, HIST_U, HIST_A, NEW_U])
    tp = tokenize_prompt(prompt, TOK, CHATML)
    end = enc(CHATML.end)
    checked = 0
    for ts in tp.segments:
        if ts.segment.id == GENERATION_PROMPT_ID:
            continue
        alone = tokenize_prompt(
            SegmentedPrompt([ts.segment]), TOK, CHATML, add_generation_prompt=False
        ).ids
        if ts.segment.role == "assistant":
            # alone, an assistant message is the last one and is left open: same ids, no end
            assert alone + end == ts.ids
        else:
            assert alone == ts.ids
        assert tp.ids[ts.start : ts.end] == ts.ids
        checked += 1
    assert checked == 4
    # segments tile the prompt exactly
    assert [ts.start for ts in tp.segments] == [0] + [ts.end for ts in tp.segments[:-1]]
    assert tp.segments[-1].end == tp.num_tokens == len(tp.ids)


def test_segment_ids_do_not_change_when_neighbours_do() -> None:
    a = tokenize_prompt(SegmentedPrompt([SYS, HIST_U, HIST_A, NEW_U]), TOK, CHATML)
    memo = Segment(SegmentKind.UPDATE, "x" * 7, "memo", "user")
    b = tokenize_prompt(SegmentedPrompt([memo, HIST_U, HIST_A, SYS, NEW_U]), TOK, CHATML)
    by_id_a = {ts.segment.id: ts.ids for ts in a.segments}
    by_id_b = {ts.segment.id: ts.ids for ts in b.segments}
    for sid in ("sys", "u0", "a0", "u1", GENERATION_PROMPT_ID):
        assert by_id_a[sid] == by_id_b[sid]
    assert by_id_b["u0"] == b.ids[b.segments[1].start : b.segments[1].end]


def test_chat_markup_per_segment() -> None:
    tp = tokenize_prompt(SegmentedPrompt([SYS, NEW_U]), TOK, CHATML)
    assert tp.segments[0].ids == enc("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert tp.segments[1].ids == enc("<|im_start|>user\nAnd 3+3?<|im_end|>\n")


def test_generation_prompt_appended_after_closed_message() -> None:
    tp = tokenize_prompt(SegmentedPrompt([SYS, NEW_U]), TOK, CHATML)
    last = tp.segments[-1]
    assert last.segment.id == GENERATION_PROMPT_ID
    assert last.kind is SegmentKind.UPDATE
    assert last.ids == enc(CHATML.generation_prompt())
    assert tp.ids[-len(last.ids) :] == enc("<|im_start|>assistant\n")


def test_generation_prompt_takes_the_scope_of_the_prompts_last_segment() -> None:
    """Its KV is stored with the prompt's, never in the namespace every scope shares."""
    scoped = [Segment(s.kind, s.text, s.id, s.role, "tenant-a") for s in (SYS, NEW_U)]
    tp = tokenize_prompt(SegmentedPrompt(scoped), TOK, CHATML)
    assert tp.segments[-1].segment.id == GENERATION_PROMPT_ID
    assert tp.segments[-1].segment.scope == "tenant-a"
    shared = tokenize_prompt(SegmentedPrompt([SYS, NEW_U]), TOK, CHATML)
    assert shared.segments[-1].segment.scope is None


def test_no_generation_prompt_when_disabled_or_without_roles() -> None:
    tp = tokenize_prompt(SegmentedPrompt([SYS, NEW_U]), TOK, CHATML, add_generation_prompt=False)
    assert all(ts.segment.id != GENERATION_PROMPT_ID for ts in tp.segments)
    raw = tokenize_prompt(SegmentedPrompt([Segment(SegmentKind.UPDATE, "plain")]), TOK, CHATML)
    assert raw.ids == enc("plain")
    assert len(raw.segments) == 1


def test_trailing_assistant_segment_left_open() -> None:
    partial = Segment(SegmentKind.UPDATE, "The answer is", "a1", "assistant")
    tp = tokenize_prompt(SegmentedPrompt([SYS, NEW_U, partial]), TOK, CHATML)
    assert tp.segments[-1].segment is partial  # no generation prompt appended
    assert tp.segments[-1].ids == enc("<|im_start|>assistant\nThe answer is")
    assert not TOK.decode(tp.ids).endswith(CHATML.end)
    # an assistant segment that is not last is closed
    closed = tokenize_prompt(SegmentedPrompt([SYS, HIST_A, NEW_U]), TOK, CHATML)
    assert closed.segments[1].ids == enc("<|im_start|>assistant\n4<|im_end|>\n")


@pytest.mark.parametrize("chat", [CHATML, LLAMA3, PLAIN], ids=lambda c: c.name)
def test_open_assistant_in_every_format(chat: object) -> None:
    from agentcache.model.tokenizer import ChatFormat

    assert isinstance(chat, ChatFormat)
    tp = tokenize_prompt(
        SegmentedPrompt([NEW_U, Segment(SegmentKind.UPDATE, "ok", None, "assistant")]), TOK, chat
    )
    assert tp.ids[-len(enc(chat.start.format(role="assistant") + "ok")) :] == enc(
        chat.start.format(role="assistant") + "ok"
    )
    assert not TOK.decode(tp.ids).endswith(chat.end)


def test_empty_segments_dropped_but_ids_kept() -> None:
    tp = tokenize_prompt(
        SegmentedPrompt([Segment(SegmentKind.SYSTEM, "abc"), Segment(SegmentKind.UPDATE, "")]),
        TOK,
        CHATML,
    )
    assert [ts.segment.text for ts in tp.segments] == ["abc"]
    assert tp.ids == enc("abc")


def test_prompt_longer_than_context_names_both_lengths() -> None:
    prompt = SegmentedPrompt([Segment(SegmentKind.UPDATE, "x" * 50)])
    assert tokenize_prompt(prompt, TOK, CHATML, max_tokens=50).num_tokens == 50
    with pytest.raises(ContextLengthError) as e:
        tokenize_prompt(prompt, TOK, CHATML, max_tokens=49)
    assert isinstance(e.value, PromptError)
    assert e.value.num_tokens == 50 and e.value.max_tokens == 49
    assert "50" in str(e.value) and "49" in str(e.value)


def test_prompt_that_tokenizes_to_nothing_raises() -> None:
    class Empty(ByteTokenizer):
        def encode(self, text: str) -> list[int]:
            return []

    with pytest.raises(PromptError, match="zero tokens"):
        tokenize_prompt(SegmentedPrompt([Segment(SegmentKind.UPDATE, "x")]), Empty(), CHATML)
