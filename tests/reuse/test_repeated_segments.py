"""A text that occurs twice in one prompt (reuse/segments.py, `commit_segments`): a cleared tool
result's placeholder, a repeated "OK". Its first occurrence is stored as its first copy; a later
one, after another context, is stored as its copy for its own context (exact, or the context
copy when computed after K/V reused approximately), so the next turn loads it as an exact run
instead of recomputing it as a copy computed elsewhere.

    1 : [ sys ][ m1 ][ h0 ][ ok ][ h1 ][ ok ][ q1 ]   every segment new; the second ok
                                                      stored as its exact copy
    2 : [ sys ][ m1 ][ h0 ][ ok ][ h1 ][ ok ][ q2 ]   both found exact, as prefix reuse finds them

    1 : [ sys ][ m1 ][ h0 ][ h1 ][ q1 ]
    2 : [ sys ][ m2 longer ][ h0 ][ h1 ][ ok ][ h2 ][ ok ][ q2 ]   h0, h1 moved, reused
        approximately; both ok new, computed after them: the second is the context copy
    3 : the same context as 2 through the second ok
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.segments import SegmentHit, find_hits
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from tests.reuse.exact_floor import exact_floor_output

PARAMS = GenerationParams(max_new_tokens=6)
OK = "[Old tool result content cleared]"
HISTORY = (
    "Earlier the user asked about trains to Lyon. " * 3,
    "Reflection: check the timetable first. " * 3,
    "The tool said the 9:14 leaves from platform 4 and arrives at noon. " * 3,
)
LONGER = "memory v2, now much longer: " * 4


def prompt(
    memory: str, body: list[str], question: str, scope: str | None = None
) -> SegmentedPrompt:
    """`body` names history texts: h0-h2 or ok (the repeated one); segment ids are unique;
    `scope` keeps every segment private to it (a tenant's)."""
    segments = [
        Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system", scope),
        Segment(K.UPDATE, memory, "memory", "user", scope),
    ]
    for i, name in enumerate(body):
        text = OK if name == "ok" else HISTORY[int(name[1:])]
        segments.append(Segment(K.FIXED, text, f"{name}-{i}", "tool", scope))
    return SegmentedPrompt([*segments, Segment(K.UPDATE, question, "q", "user", scope)])


def hits(e: Engine, p: SegmentedPrompt, context_copies: bool = True) -> dict[str, SegmentHit]:
    t = e.tokenize(p)
    stats = ReuseStats(t.num_tokens, e.model.config.num_layers)
    found = find_hits(replace(e.ctx, context_copies=context_copies), t, stats)
    return {h.segment.segment.id: h for h in found if not h.head}


APPEND = ["h0", "ok", "h1", "ok"]


def test_a_repeated_text_is_found_exact_at_each_place_it_was_computed(tiny: LoadedModel) -> None:
    e = Engine(tiny)
    e.generate(prompt("memory v1", APPEND, "q1"), PARAMS, strategy="epic")
    found = hits(e, prompt("memory v1", APPEND, "q2"))
    assert set(found) == {"sys", "h0-0", "ok-1", "h1-2", "ok-3"}
    first, second = found["ok-1"], found["ok-3"]
    assert not first.copy  # the first copy, stored after this context: an exact run as it is
    # the second occurrence is its exact copy for its own context, not the first's K/V
    assert second.copy and not second.context_copy
    assert int(second.kv.positions[0]) == second.segment.start
    assert int(first.kv.positions[0]) == first.segment.start


def test_an_exact_turn_with_a_repeated_text_computes_what_prefix_computes(
    tiny: LoadedModel,
) -> None:
    """The next turn's plan is exact (nothing moved) and computes only what exact prefix reuse
    computes; its output is full recompute's."""
    turns = [prompt("memory v1", APPEND, "q1"), prompt("memory v1", APPEND, "q2")]
    out = {}
    for name in ("prefix", "rpdc"):
        e = Engine(tiny, EngineConfig(strategy=name))
        e.generate(turns[0], PARAMS)
        out[name] = e.generate(turns[1], PARAMS)
    ref = Engine(tiny).generate(turns[1], PARAMS, strategy="full")
    assert out["rpdc"].token_ids == ref.token_ids
    assert (out["rpdc"].first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
    # before, the second ok was found not exact here and computed: more than prefix computed
    assert out["rpdc"].stats.computed_tokens <= out["prefix"].stats.computed_tokens


def test_a_repeated_texts_copies_stay_in_their_scope(tiny: LoadedModel) -> None:
    """The copies are keyed with the segment's scope: another tenant with the same prompt
    finds none of them, not even the repeated text's."""
    e = Engine(tiny)
    e.generate(prompt("memory v1", APPEND, "q1", scope="tenant-a"), PARAMS, strategy="epic")
    assert hits(e, prompt("memory v1", APPEND, "q2", scope="tenant-a"))["ok-3"].copy
    assert hits(e, prompt("memory v1", APPEND, "q2", scope="tenant-b")) == {}


EDITED = ["h0", "h1", "ok", "h2", "ok"]


def edited_turns(tiny: LoadedModel) -> Engine:
    """Turns 1 and 2 (epic): in 2 both ok are computed after h0 and h1 reused approximately."""
    e = Engine(tiny)
    e.generate(prompt("memory v1", ["h0", "h1"], "q1"), PARAMS, strategy="epic")
    second = e.generate(prompt(LONGER, EDITED, "q2"), PARAMS, strategy="epic")
    assert (second.stats.moved_tokens or 0) > 0
    return e


@pytest.mark.parametrize("context_copies", [True, False])
def test_a_repeated_text_after_approximate_kv_is_its_context_copy(
    tiny: LoadedModel, context_copies: bool
) -> None:
    e = edited_turns(tiny)
    found = hits(e, prompt(LONGER, EDITED, "q3"), context_copies)
    for name in ("ok-2", "ok-4"):
        h = found[name]
        # what turn 2 used at this place, loaded as it is; without context copies (the exact
        # floor) neither is an exact run here
        assert h.context_copy == context_copies and not h.copy
        if context_copies:
            assert int(h.kv.positions[0]) == h.segment.start


def test_the_exact_floor_gives_full_recomputes_output_after_repeated_texts(
    tiny: LoadedModel,
) -> None:
    e = edited_turns(tiny)
    out = exact_floor_output(tiny, e.store, prompt(LONGER, EDITED, "q3"), PARAMS)
    assert out.stats.context_copy_tokens == 0
