"""Heads (reuse/segments.py): a segment whose text is not in the store, but which opens with
the tokens of a segment stored after this very context, loads that opening as an exact run
and computes the rest. Counted, not timed; the output checked against full recompute's.

    1 : [ sys ][ # Tools ... fn_a, fn_b ][ q1 ]   the tools block stored after "sys"
    2 : [ sys ][ # Tools ... fn_c ][ q2 ]          its opening loaded exactly, the rest computed

An update (a new question, a state block) is computed, but the opening it shares with the
update stored after the same context (its chat header, lines that stayed) is found alike.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agentcache.kv.store import MissReason
from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.segments import MIN_HEAD, HeadIndex, head_index
from agentcache.runtime import Engine, EngineConfig, GenerationParams, TurnStats

ONE = GenerationParams(max_new_tokens=1)
OPENING = "# Tools\n\nYou may call one or more functions to assist with the user query. " * 3
SYSTEM = "You are a careful assistant. Answer briefly."


def tools(names: str) -> str:
    lines = (f"\nTool {n}(item: int): the state of item {n}, as JSON." for n in names)
    return OPENING + "".join(lines)


def prompt(
    names: str, question: str, system: str = SYSTEM, scope: str | None = None
) -> SegmentedPrompt:
    return SegmentedPrompt([
        Segment(K.SYSTEM, system, "sys", "system", scope),
        Segment(K.FIXED, tools(names), "tools", "system", scope),
        Segment(K.UPDATE, question, "q", "user", scope),
    ])  # fmt: skip


FIRST = prompt("ab", "What is item 3?")
OTHER = prompt("cd", "And item 4?")  # the same system prompt, another tool list


def run(tiny: LoadedModel, strategy: str, *prompts: SegmentedPrompt) -> tuple[Engine, TurnStats]:
    engine = Engine(tiny, EngineConfig(strategy=strategy))
    stats = [engine.generate(p, ONE).stats for p in prompts]
    return engine, stats[-1]


def opening(engine: Engine, a: SegmentedPrompt, b: SegmentedPrompt) -> int:
    """Tokens of b's tools block its opening shares with a's."""
    x, y = engine.tokenize(a).segments[1].ids, engine.tokenize(b).segments[1].ids
    return next(i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)


def first_logits(engine: Engine, p: SegmentedPrompt) -> tuple[torch.Tensor, object]:
    seq, pre = engine.prefill(engine.tokenize(p))
    seq.free()
    return pre.logits, pre.stats


def test_a_changed_segment_loads_its_stored_opening_exactly(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST)
    shared = opening(engine, FIRST, OTHER)
    assert shared >= MIN_HEAD
    t = engine.tokenize(OTHER)
    logits, stats = first_logits(engine, OTHER)
    assert stats.head_tokens == shared
    assert stats.loaded_tokens == len(t.segments[0].ids) + shared  # system + the opening
    assert [m.segment_id for m in stats.misses] == ["tools"]  # its text was not found
    assert stats.exact_plan and bool(stats.exact[: t.segments[1].start + shared].all())
    ref, _ = first_logits(Engine(tiny, EngineConfig(strategy="full")), OTHER)
    torch.testing.assert_close(logits, ref, atol=2e-4, rtol=0)


def test_the_default_loads_at_least_what_prefix_loads(tiny: LoadedModel) -> None:
    _, prefix = run(tiny, "prefix", FIRST, OTHER)
    _, default = run(tiny, "rpdc", FIRST, OTHER)
    assert prefix.loaded_tokens > 0
    assert default.loaded_tokens >= prefix.loaded_tokens
    assert default.recomputed_tokens <= prefix.recomputed_tokens
    assert default.model_calls == prefix.model_calls  # no probe: the plan is exact


def test_a_block_with_a_line_added_at_its_end_reuses_the_whole_old_block(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST)
    longer = prompt("abc", "What is item 5?")
    t = engine.tokenize(longer)
    _, stats = first_logits(engine, longer)
    old = len(engine.tokenize(FIRST).segments[1].ids)
    assert stats.head_tokens == opening(engine, FIRST, longer)
    assert stats.head_tokens > 0.95 * old  # all of the old block but its closing tokens
    assert stats.loaded_tokens == len(t.segments[0].ids) + stats.head_tokens


def test_another_context_before_it_finds_no_head(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST)
    other = prompt("cd", "And item 4?", system="Be kind. " + SYSTEM)
    t = engine.tokenize(other)
    _, stats = first_logits(engine, other)
    # the system message's framing (`<|im_start|>system` ...) is its own head; the tools block,
    # after another system prompt, finds none
    assert stats.head_tokens < len(t.segments[0].ids)
    tools_block = slice(t.segments[1].start, t.segments[1].end)
    assert stats.reused is not None and not bool(stats.reused[tools_block].any())


def test_another_scope_finds_no_head(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", prompt("ab", "What is item 3?", scope="tenant-a"))
    _, stats = first_logits(engine, prompt("cd", "And item 4?", scope="tenant-b"))
    assert stats.head_tokens == 0 and stats.loaded_tokens == 0
    _, same = first_logits(engine, prompt("cd", "And item 4?", scope="tenant-a"))
    assert same.head_tokens > 0


def test_a_head_dropped_from_the_store_is_skipped_and_counts_no_second_miss(
    tiny: LoadedModel,
) -> None:
    engine, _ = run(tiny, "rpdc", FIRST)
    engine.store.clear()
    before = engine.store.stats.misses
    _, stats = first_logits(engine, OTHER)
    assert stats.head_tokens == 0
    assert engine.store.stats.misses - before == 2  # the system prompt and the tools block
    assert {m.reason for m in stats.misses} == {MissReason.NEW}


def test_the_index_keeps_the_newest_few_per_context_within_its_tokens() -> None:
    index = HeadIndex(max_tokens=100)
    ids = list(range(40))
    for k in range(6):
        index.add("ns", "ctx", f"c{k}", [k, *ids])
    found = index.longest("ns", "ctx", torch.tensor([5, *ids], dtype=torch.int32))
    assert [c for c, _ in found][:1] == ["c5"] and found[0][1] == 41
    assert len(found) <= 2  # 41 tokens each: two fit in 100
    index.add("ns", "other", "d", ids)  # 82 + 40 > 100: the context stored least recently leaves
    assert index.longest("ns", "ctx", torch.tensor(ids, dtype=torch.int32)) == []
    assert index.longest("ns", "other", torch.tensor(ids, dtype=torch.int32)) == [("d", 40)]
    assert index.longest("ns", "other", [*ids[:30], 99]) == [("d", 30)]  # token ids as a list
    index.add("ns", "short", "s", ids[:MIN_HEAD])  # the shortest worth remembering
    assert index.longest("ns", "short", torch.tensor(ids, dtype=torch.int32)) == [("s", MIN_HEAD)]
    index.add("ns", "none", "e", [])
    assert index.longest("ns", "none", torch.tensor(ids, dtype=torch.int32)) == []


def test_the_index_belongs_to_its_store(tiny: LoadedModel) -> None:
    a, _ = run(tiny, "rpdc", FIRST)
    b = Engine(tiny, EngineConfig(strategy="rpdc"))
    assert head_index(a.store) is head_index(a.store)
    assert head_index(a.store) is not head_index(b.store)
    _, stats = first_logits(b, OTHER)
    assert stats.head_tokens == 0


def asked(system: str, tools_names: str, question: str) -> SegmentedPrompt:
    """As the server segments a chat: every message a fixed segment but the system ones."""
    return SegmentedPrompt([
        Segment(K.SYSTEM, system, "sys", "system"),
        Segment(K.FIXED, tools(tools_names), "tools", "system"),
        Segment(K.FIXED, question, f"q-{question}", "user"),
        Segment(K.UPDATE, "", "gen", "assistant"),
    ])  # fmt: skip


@pytest.mark.parametrize(
    "first, then",
    [
        (asked(SYSTEM, "ab", "What is item 3?"), asked(SYSTEM, "ab", "0) Which item is late?")),
        (asked(SYSTEM, "ab", "What is item 3?"), asked(SYSTEM, "cd", "What is item 3?")),
        (asked(SYSTEM, "abc", "Item 3?"), asked(SYSTEM + " Be brief.", "abc", "Item 3?")),
    ],
)
def test_on_every_prefix_hit_the_default_loads_at_least_what_prefix_loads(
    tiny: LoadedModel, first: SegmentedPrompt, then: SegmentedPrompt
) -> None:
    _, prefix = run(tiny, "prefix", first, then)
    _, default = run(tiny, "rpdc", first, then)
    assert prefix.loaded_tokens > 0
    assert default.loaded_tokens >= prefix.loaded_tokens
    # on the exact part the default computes no more than prefix (the third case also reuses
    # the tools block and the question approximately, behind the changed system prompt)
    assert default.recomputed_tokens <= prefix.recomputed_tokens


def noted(note: str) -> SegmentedPrompt:
    """A note without chat framing after a system prompt of 44 tokens: `prefix`'s third block
    reaches 4 tokens into the note, whose first 5 ("Note ") every note shares."""
    return SegmentedPrompt([
        Segment(K.SYSTEM, "Be careful. ok", "sys", "system"),
        Segment(K.FIXED, note, f"n-{note}", None),
        Segment(K.UPDATE, "Go on.", "q", "user"),
    ])  # fmt: skip


def test_a_shared_opening_shorter_than_a_block_is_loaded_too(tiny: LoadedModel) -> None:
    first, then = noted("Note 1: the alpha report is late."), noted("Note 2: the beta is on time.")
    engine, prefix = run(tiny, "prefix", first, then)
    t = engine.tokenize(then)
    assert t.segments[1].start % 16 + 5 >= 16 > 5  # the premise: a block ends inside the note
    _, default = run(tiny, "rpdc", first, then)
    _, stats = first_logits(run(tiny, "rpdc", first)[0], then)
    assert 0 < stats.head_tokens < 16
    assert default.loaded_tokens >= prefix.loaded_tokens > t.segments[1].start


@pytest.mark.parametrize("strategy", ["epic", "cacheblend", "cacheslide"])
def test_other_selective_strategies_take_the_head_too(tiny: LoadedModel, strategy: str) -> None:
    engine, _ = run(tiny, strategy, FIRST)
    _, stats = first_logits(engine, OTHER)
    assert stats.head_tokens == opening(engine, FIRST, OTHER)


def test_an_updates_opening_after_an_unchanged_context_is_an_exact_run(tiny: LoadedModel) -> None:
    first, then = prompt("ab", "What is item 3?"), prompt("ab", "What is item 4?")
    engine, _ = run(tiny, "rpdc", first)
    t = engine.tokenize(then)
    q, q_before = t.segments[2], engine.tokenize(first).segments[2]
    shared = next(i for i, (a, b) in enumerate(zip(q.ids, q_before.ids, strict=False)) if a != b)
    assert shared > 0
    logits, stats = first_logits(engine, then)
    assert stats.head_tokens == shared
    assert stats.loaded_tokens == q.start + shared  # system, tools, the question's opening
    assert stats.misses == []  # an update is not looked up: nothing missed
    assert stats.exact_plan and bool(stats.exact[: q.start + shared].all())
    ref, _ = first_logits(Engine(tiny, EngineConfig(strategy="full")), then)
    torch.testing.assert_close(logits, ref, atol=2e-4, rtol=0)
    # exact prefix reuse loads whole blocks of the same tokens: no more than the default
    _, prefix = run(tiny, "prefix", first, then)
    _, default = run(tiny, "rpdc", first, then)
    assert default.loaded_tokens >= prefix.loaded_tokens
    assert default.recomputed_tokens <= prefix.recomputed_tokens


def test_without_update_heads_an_update_is_computed_whole(tiny: LoadedModel) -> None:
    first, then = prompt("ab", "What is item 3?"), prompt("ab", "What is item 4?")
    engine, _ = run(tiny, "rpdc", first)
    engine.ctx = replace(engine.ctx, update_heads=False)
    _, stats = first_logits(engine, then)
    assert stats.head_tokens == 0
    assert stats.loaded_tokens == engine.tokenize(then).segments[2].start
