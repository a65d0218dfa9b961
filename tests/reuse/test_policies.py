"""The small policies selective recompute is made of: the typed budget, the bounded counts of
the position plans, the offset ranker against the plain offset order."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.reuse import StrategySpec
from agentcache.reuse.budget import (
    AtLeastRatio,
    Covered,
    EpicCount,
    PerComputedToken,
    RatioOfReused,
)
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.positions import BoundedCounts, ModeStart, segment_key
from agentcache.reuse.ranking.offset import by_offset
from agentcache.reuse.runs import ReusedRun
from agentcache.reuse.upfront import select_up_front
from agentcache.runtime import Engine
from tests.reuse.test_contract import agent_prompt


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("rpdc", Covered(PerComputedToken(0.2), 1.5, 256)),
        ("rpdc:cover=0", PerComputedToken(0.2)),  # no cover rule: no default floor either
        ("rpdc:cover=2", Covered(PerComputedToken(0.2), 2.0, 0)),
        ("rpdc:cover_min=50", Covered(PerComputedToken(0.2), 1.5, 50)),
        ("rpdc:cover=1.5", Covered(PerComputedToken(0.2), 1.5, 0)),  # the rule without its floor
        ("rpdc:cover=0:cover_min=64", Covered(PerComputedToken(0.2), 0.0, 64)),
        ("pic:selection=offset:cover_min=8", Covered(RatioOfReused(0.0), 0.0, 8)),
        ("rpdc:ratio=0.3", RatioOfReused(0.3)),
        ("rpdc:per_chunk=64", EpicCount(64)),
        ("cacheblend", RatioOfReused(0.15)),
        ("pic", RatioOfReused(0.0)),
        ("rpdc:cover=0.5", Covered(PerComputedToken(0.2), 0.5, 0)),
        ("rpdc:ratio=0.3:cover=1", Covered(RatioOfReused(0.3), 1.0, 0)),
        ("rpdc:extra=0.5", PerComputedToken(0.5)),  # a budget given replaces cover too
        ("rpdc:extra=0.5:cover=2", Covered(PerComputedToken(0.5), 2.0, 0)),
        ("rpdc:min_ratio=0.25", Covered(AtLeastRatio(PerComputedToken(0.2), 0.25), 1.5, 256)),
        ("rpdc:per_chunk=8:min_ratio=0.1", AtLeastRatio(EpicCount(8), 0.1)),
    ],
)
def test_spec_budgets_parse_into_one_tagged_value(text: str, budget: object) -> None:
    assert StrategySpec.parse(text).build().options.budget == budget  # type: ignore[attr-defined]


def test_bounded_counts_forget_the_least_recently_used_key() -> None:
    counts = BoundedCounts(max_keys=2)
    counts.add("a", 1)
    counts.add("b", 5)
    assert counts.get("a") == {1: 1}  # "a" is now the most recently used
    counts.add("c", 7)
    assert len(counts) == 2
    assert counts.get("b") is None and counts.get("a") == {1: 1} and counts.get("c") == {7: 1}


def test_most_frequent_breaks_ties_toward_the_smallest_value() -> None:
    counts = BoundedCounts()
    assert counts.most_frequent("a") is None
    for v in (40, 7, 40, 7, 3):
        counts.add("a", v)
    assert counts.most_frequent("a") == 7  # 40 and 7 twice each: the smaller wins
    counts.add("a", 40)
    assert counts.most_frequent("a") == 40


def test_plan_history_keys_are_scoped(tiny: LoadedModel) -> None:
    """The same text in two conversations is two histories: one cannot move the other."""
    engine = Engine(tiny)
    seg = engine.tokenize(agent_prompt("x")).segments[1]
    mine = replace(seg, segment=replace(seg.segment, scope="conversation-a"))
    theirs = replace(seg, segment=replace(seg.segment, scope="conversation-b"))
    assert len({segment_key(seg), segment_key(mine), segment_key(theirs)}) == 3
    plan = ModeStart()
    plan.starts.add(segment_key(theirs), 999)
    assert plan.starts.most_frequent(segment_key(mine)) is None


@pytest.mark.parametrize("bound", [2, 3])
def test_the_mode_plan_keeps_at_most_its_bound_of_segments(tiny: LoadedModel, bound: int) -> None:
    plan = ModeStart()
    plan.starts = BoundedCounts(max_keys=bound)
    engine = Engine(tiny)
    for turn in range(3):  # sys, h1, h2 are recorded each turn (update segments never)
        plan.positions(engine.tokenize(agent_prompt(f"memory v{turn} " * (turn + 1))), [])
    assert len(plan.starts) == bound
    sys, _, _, h2, *_ = engine.tokenize(agent_prompt("x")).segments
    h2_counts = plan.starts.get(segment_key(h2))
    assert h2_counts is not None
    if bound == 3:  # every segment kept: one start per turn
        assert sum(h2_counts.values()) == 3
    else:  # sys, the least recently recorded, is forgotten each turn
        assert plan.starts.get(segment_key(sys)) is None


@pytest.mark.parametrize(("cover", "covered"), [(0.0, False), (0.5, False), (1.5, True)])
def test_cover_spends_every_candidate_only_when_they_are_few(cover: float, covered: bool) -> None:
    """10 tokens computed anyway (0-4 and 19-23), 14 candidates (5-18): cover 1.5 allows up to
    15, so all 14 are computed; 0.5 allows 5, so `extra`'s 0.2 x 10 = 2 stay the budget."""
    runs = [ReusedRun(5, 7), ReusedRun(12, 7)]  # 14 reused tokens, context changed
    o = SelectiveOptions(selection="offset", extra=0.2, cover=cover)
    sel = select_up_front(o, 24, runs)
    assert sel.budget == (14 if covered else 2)
    assert int((sel.base[5:19]).sum()) == sel.budget


@pytest.mark.parametrize(
    ("cover", "cover_min", "covered"),
    [(1.5, 0, False), (1.5, 13, False), (1.5, 14, True), (0.0, 14, True), (1.5, 40, True)],
)
def test_cover_min_computes_few_candidates_however_few_are_computed(
    cover: float, cover_min: int, covered: bool
) -> None:
    """4 tokens computed anyway (0-1 and 22-23), 14 candidates (2-15), 6 exact (16-21): cover
    1.5 allows 6, so only a floor of at least 14 computes all 14; below it `extra`'s
    ceil(0.2 x 4) = 1 stays the budget."""
    runs = [ReusedRun(2, 14), ReusedRun(16, 6, exact=True)]
    o = SelectiveOptions(selection="offset", extra=0.2, cover=cover, cover_min=cover_min)
    sel = select_up_front(o, 24, runs)
    assert int((~sel.reused).sum()) == 4
    assert sel.budget == (14 if covered else 1)
    assert int(sel.base[2:16].sum()) == sel.budget and not bool(sel.base[16:22].any())


@pytest.mark.parametrize(("min_ratio", "budget"), [(0.0, 2), (0.1, 2), (0.25, 4), (1.0, 14)])
def test_min_ratio_floors_the_budget_in_the_candidates(min_ratio: float, budget: int) -> None:
    """10 tokens computed anyway, 14 candidates, cover 0.5 (allows 5, so not exact): `extra`
    gives 2; a floor of min_ratio x 14 (rounded up) raises it when larger."""
    runs = [ReusedRun(5, 7), ReusedRun(12, 7)]
    o = SelectiveOptions(selection="offset", extra=0.2, cover=0.5, min_ratio=min_ratio)
    sel = select_up_front(o, 24, runs)
    assert sel.budget == budget
    assert int((sel.base[5:19]).sum()) == budget


@pytest.mark.parametrize(("cover", "covered"), [(0.5, False), (1.5, True)])
def test_starts_add_each_runs_first_tokens_to_a_ranked_turn_only(
    cover: float, covered: bool
) -> None:
    """10 tokens computed anyway (3-4, 21-28), 14 candidates in two runs (5-11, 12-18), an
    exact run at 0 and one after them: ranked (cover 0.5), `starts=3` computes 5-7 and 12-14 besides
    `extra`'s budget of ceil(0.2 x 10) = 2, which it leaves as it was; covered (1.5), every
    candidate is computed, as without it. Exact runs and a run at index 0 get no starts."""
    runs = [ReusedRun(0, 3, exact=True), ReusedRun(5, 7), ReusedRun(12, 7), ReusedRun(19, 2, True)]
    without = SelectiveOptions(selection="offset", extra=0.2, cover=cover)
    plain = select_up_front(without, 29, runs)
    sel = select_up_front(replace(without, starts=3), 29, runs)
    assert plain.budget == sel.budget == (14 if covered else 2)
    if covered:
        assert torch.equal(sel.base, plain.base) and bool(sel.base[5:19].all())
    else:
        assert bool(sel.base[5:8].all()) and bool(sel.base[12:15].all())
        assert int(sel.base[5:19].sum()) == 6 + 2  # the starts, then the budget's picks
        assert int(plain.base[5:19].sum()) == 2
    assert not bool(sel.base[:3].any()) and not bool(sel.base[19:21].any())


@pytest.mark.parametrize(
    ("cover", "over", "epic"), [(0.5, 1.0, True), (0.5, 2.0, False), (1.5, 1.0, False)]
)
def test_epic_over_computes_chunk_starts_on_a_thin_ranked_turn_only(
    cover: float, over: float, epic: bool
) -> None:
    """The runs above: 10 tokens computed anyway, 14 candidates. Ranked (cover 0.5) with more
    than `epic_over` = 1 candidate per computed token, the turn computes the first `epic_k` = 3
    of each moved run (5-7, 12-14) and ranks nothing (budget 0); at `epic_over` = 2 (14 <= 20)
    it ranks as without the option; covered (1.5), every candidate is computed as before."""
    runs = [ReusedRun(0, 3, exact=True), ReusedRun(5, 7), ReusedRun(12, 7), ReusedRun(19, 2, True)]
    without = SelectiveOptions(probe_layers=2, selection="attention", extra=0.2, cover=cover)
    plain = select_up_front(without, 29, runs)
    sel = select_up_front(replace(without, epic_over=over, epic_k=3), 29, runs)
    assert sel.epic_turn is epic and not plain.epic_turn
    if not epic:
        assert torch.equal(sel.base, plain.base) and sel.budget == plain.budget
        return
    assert sel.budget == 0 and plain.budget == 2
    assert bool(sel.base[5:8].all()) and bool(sel.base[12:15].all())
    assert int(sel.base[5:19].sum()) == 6 and not bool(sel.base[:3].any())
    assert not bool(sel.base[19:21].any()) and torch.equal(sel.candidates, plain.candidates)


def test_epic_over_parses_beside_the_default_budget() -> None:
    strategy = StrategySpec.parse("rpdc:epic_over=4:epic_k=32").build()
    o = strategy.options  # type: ignore[attr-defined]
    assert (o.epic_over, o.epic_k) == (4.0, 32)
    assert o.budget == Covered(PerComputedToken(0.2), 1.5, 256)


def test_starts_parse_and_keep_the_default_budget() -> None:
    strategy = StrategySpec.parse("rpdc:starts=16").build()
    assert strategy.options.starts == 16  # type: ignore[attr-defined]
    assert strategy.options.budget == Covered(PerComputedToken(0.2), 1.5, 256)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("rpdc:min_ratio=1.5", "min_ratio must be in"),
        ("rpdc:min_ratio=-0.1", "min_ratio must be in"),
        ("rpdc:ratio=0.3:min_ratio=0.1", "min_ratio floors an extra or per_chunk budget"),
        ("rpdc:cover=-1", "cover must be >= 0"),
        ("pic:cover=1", "needs a ranking"),
        ("rpdc:cover_min=-1", "cover_min must be >= 0"),
        ("rpdc:cover_min=1.5", "cover_min must be an integer"),
        ("rpdc:cover_min=many", "cover_min must be an integer"),
        ("pic:cover_min=8", "needs a ranking"),
        ("rpdc:epic_over=-1", "epic_over must be >= 0"),
        ("rpdc:epic_k=0", "epic_k must be >= 1"),
        ("rpdc:epic_over=lots", "epic_over must be"),
    ],
)
def test_cover_refuses_what_it_cannot_spend(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        StrategySpec.parse(text).build()


@pytest.mark.parametrize("chunks", ["segment", "span"])
@pytest.mark.parametrize("budget", [0, 3, 7, 12, 40])
def test_the_offset_ranker_picks_the_plain_offset_order(chunks: str, budget: int) -> None:
    runs = [ReusedRun(0, 6, exact=True), ReusedRun(8, 5), ReusedRun(13, 9, joins_previous=True)]
    ratio = min(1.0, budget / 14)
    o = SelectiveOptions(selection="offset", chunks=chunks, ratio=ratio, exact_prefix=True)
    sel = select_up_front(o, 24, runs)
    candidates = torch.zeros(24, dtype=torch.bool)
    candidates[8:22] = True
    spans = [(0, 6), (8, 22)] if chunks == "span" else [(0, 6), (8, 13), (13, 22)]
    want = by_offset(spans, candidates, sel.budget)
    assert torch.equal(sel.base & candidates, want)
    assert int(want.sum()) == min(14, sel.budget)
