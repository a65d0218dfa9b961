"""First copies computed after approximate K/V (reuse/segments.py): a segment first stored by
a turn that reused something before it approximately holds K/V that is not full recompute's
after its context. It is stored under that context marked inexact: a later prompt with the
same context finds it as a context copy (loaded as it is, counted apart), and where outputs
must equal full recompute's (`context_copies=False`: the planner's exact floor) it is a
candidate like any copy computed elsewhere, never an exact run.

    1 : [ sys ][ m1 ][ h0 ][ h1 ][ q1 ]            epic: every segment new
    2 : [ sys ][ m2 longer ][ h0 ][ h1 ][ h2 ][ q2 ]  h0, h1 moved and reused approximately;
                                                   h2 new, computed after them: inexact
    3 : [ sys ][ m2 longer ][ h0 ][ h1 ][ h2 ][ q3 ]  the same context as 2 through h2
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentcache.kv.store import computed_after, inexact_context, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.segments import chain_ids, find_hits, head_index, scoped
from agentcache.runtime import Engine, GenerationParams
from tests.reuse.exact_floor import exact_floor_output

PARAMS = GenerationParams(max_new_tokens=6)
HISTORY = (
    "Earlier the user asked about trains to Lyon. " * 3,
    "Reflection: check the timetable first. " * 3,
    "The tool said the 9:14 leaves from platform 4 and arrives at noon. " * 3,
)
LONGER = "memory v2, now much longer: " * 4


def prompt(memory: str, history: int, question: str) -> SegmentedPrompt:
    segments = [
        Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system"),
        Segment(K.UPDATE, memory, "memory", "user"),
    ]
    segments += [Segment(K.FIXED, HISTORY[i], f"h{i}", "user") for i in range(history)]
    return SegmentedPrompt([*segments, Segment(K.UPDATE, question, "q", "user")])


def two_turns(tiny: LoadedModel) -> Engine:
    """Turns 1 and 2 (epic) on a fresh engine: h2's first copy is computed after h0 and h1
    reused approximately."""
    e = Engine(tiny)
    e.generate(prompt("memory v1", 2, "q1"), PARAMS, strategy="epic")
    second = e.generate(prompt(LONGER, 3, "q2"), PARAMS, strategy="epic")
    assert (second.stats.moved_tokens or 0) > 0  # h0 and h1 reused where they now sit
    assert (second.stats.computed_tokens or 0) < second.stats.prompt_tokens
    return e


def h2_first_copy(e: Engine) -> tuple[str | None, str]:
    """The context id h2's first copy is stored under, and h2's context in turn 3."""
    t = e.tokenize(prompt(LONGER, 3, "q3"))
    h2 = t.segments[4]
    cid = segment_content_id(h2.ids, None)
    m = e.model
    kv = e.store.lookup_content(m.model_id, m.tokenizer.tokenizer_id, cid).kv
    assert kv is not None
    return kv.context_id, chain_ids(t)[4]


def test_a_segment_computed_after_approximate_kv_is_stored_marked_inexact(
    tiny: LoadedModel,
) -> None:
    e = two_turns(tiny)
    stored, context = h2_first_copy(e)
    assert stored == inexact_context(context) != context
    assert computed_after(stored) == context
    # nor is its opening offered as an exact head after that context
    t = e.tokenize(prompt(LONGER, 3, "q3"))
    space = scoped("segment", t.segments[4])
    assert head_index(e.store).longest(space, context, t.segments[4].ids) == []


def test_a_segment_computed_exactly_is_stored_under_its_context(tiny: LoadedModel) -> None:
    e = Engine(tiny)
    e.generate(prompt("memory v1", 3, "q1"), PARAMS, strategy="epic")  # nothing reused
    t = e.tokenize(prompt("memory v1", 3, "q2"))
    cid = segment_content_id(t.segments[4].ids, None)
    kv = e.store.lookup_content(e.model.model_id, e.model.tokenizer.tokenizer_id, cid).kv
    assert kv is not None and kv.context_id == chain_ids(t)[4]


@pytest.mark.parametrize("context_copies", [True, False])
def test_the_same_context_finds_it_as_a_context_copy_or_not_exact(
    tiny: LoadedModel, context_copies: bool
) -> None:
    e = two_turns(tiny)
    t = e.tokenize(prompt(LONGER, 3, "q3"))
    stats = ReuseStats(t.num_tokens, tiny.config.num_layers)
    ctx = replace(e.ctx, context_copies=context_copies)
    hits = {h.segment.segment.id: h for h in find_hits(ctx, t, stats)}
    h2 = hits["h2"]
    if context_copies:  # what turn 2 used after this context, loaded as it is
        assert h2.context_copy and h2.stored_context == chain_ids(t)[4]
        assert stats.context_copy_tokens >= h2.num_tokens
    else:  # exact nowhere: its stored context is no prompt's
        assert not h2.context_copy and h2.stored_context != chain_ids(t)[4]


def test_the_exact_floor_gives_full_recomputes_output_after_an_approximate_turn(
    tiny: LoadedModel,
) -> None:
    # before inexact first copies, h2's K/V (computed after turn 2's approximate h0 and h1)
    # was loaded as an exact run here: first-token logits 0.0475 apart on this model
    e = two_turns(tiny)
    out = exact_floor_output(tiny, e.store, prompt(LONGER, 3, "q3"), PARAMS)
    assert out.stats.reused_tokens > 0 and out.stats.context_copy_tokens == 0
