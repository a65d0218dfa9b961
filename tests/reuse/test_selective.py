from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from agentcache.bench.reuse.metrics import kl
from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.segments import SegmentKind as K
from agentcache.reuse.base import PrefillResult, ReuseStats
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.ranking.probs import attention_probs, attention_probs_reference
from agentcache.reuse.wca import cksim, wca_weight
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from tests.reuse.test_contract import agent_prompt, update_head

ONE = GenerationParams(max_new_tokens=1)


def second_turn(tiny: LoadedModel, name: str, **options: object) -> Engine:
    engine = Engine(tiny, EngineConfig(strategy=name, strategy_options={name: dict(options)}))
    engine.generate(agent_prompt("memory v1"), ONE)
    return engine


def shifted(engine: Engine):  # type: ignore[no-untyped-def]
    return engine.generate(agent_prompt("memory v2 is longer than before " * 5), ONE).stats


SHIFTED = "memory v2 is longer than before " * 5
CHUNK_KINDS = ("span", "segment")


def first_token_kl_vs_full(tiny: LoadedModel, name: str, **options: object) -> float:
    """KL(full || strategy) of the first token on the shifted second turn."""
    ref = Engine(tiny).generate(agent_prompt(SHIFTED), ONE, strategy="full")
    out = second_turn(tiny, name, **options).generate(agent_prompt(SHIFTED), ONE)
    return float(kl(ref.first_token_logits, out.first_token_logits))


def test_pic_computes_only_update_and_missing_tokens(tiny: LoadedModel) -> None:
    engine = second_turn(tiny, "pic")
    prompt = engine.tokenize(agent_prompt("memory v2 is longer than before " * 5))
    stats = shifted(engine)
    fixed = sum(len(s.ids) for s in prompt.segments if s.kind in ("system", "fixed"))
    head = update_head(engine, "memory v1", SHIFTED)  # the update's opening, exact
    assert head > 0
    assert stats.reused_tokens == fixed + head
    assert stats.recomputed_tokens == prompt.num_tokens - fixed - head


def test_epic_recomputes_first_k_of_each_non_first_chunk(tiny: LoadedModel) -> None:
    pic, epic = shifted(second_turn(tiny, "pic")), shifted(second_turn(tiny, "epic", boundary_k=8))
    # chunks: the update's head (exact, but epic knows no exact runs), h1, h2; not sys
    assert epic.recomputed_tokens - pic.recomputed_tokens == 3 * 8


def test_cacheblend_budget_and_layer0(tiny: LoadedModel) -> None:
    stats = shifted(second_turn(tiny, "cacheblend", ratio=0.25))
    pic = shifted(second_turn(tiny, "pic"))
    selected = math.ceil(0.25 * stats.reused_tokens)
    # every token was computed at layer 0; beyond that, the update tokens plus the selection
    assert stats.recomputed_tokens == stats.prompt_tokens
    assert stats.recompute_fraction > pic.recompute_fraction
    layers, t = tiny.config.num_layers, stats.prompt_tokens
    q = pic.recomputed_tokens + selected
    f = tiny.config.qkv_fraction()
    # layer 0: all tokens; layer 1 (check): Q/K/V for all, the rest for Q; layers 2..: Q
    expected = (t + f * t + (1 - f) * q + q * (layers - 2)) / (t * layers)
    assert stats.recompute_fraction == pytest.approx(expected)


def test_more_budget_is_closer_to_full(tiny: LoadedModel) -> None:
    def kl_of(name: str, **o: object) -> float:
        return first_token_kl_vs_full(tiny, name, **o)

    assert kl_of("cacheblend", ratio=1.0) < 1e-8  # everything recomputed: exact
    assert kl_of("cacheblend", ratio=0.5) <= kl_of("pic") + 1e-9


def test_mode_plan_keeps_cached_positions(tiny: LoadedModel) -> None:
    engine = second_turn(tiny, "cacheslide", plan="mode")
    out = engine.generate(agent_prompt("memory v2 is longer than before " * 5), ONE)
    assert out.stats.reused_tokens > 0  # runs; positions may overlap their neighbours


def test_wca_gating_and_promotion_run(tiny: LoadedModel) -> None:
    removal = shifted(second_turn(tiny, "cacheslide", tau=0.9))
    promote = shifted(second_turn(tiny, "cacheslide", tau=0.9, promotion="catch-up"))
    assert promote.recompute_fraction >= removal.recompute_fraction


def test_wca_weight_and_cksim() -> None:
    k = torch.randn(5, 2, 4)
    assert torch.equal(wca_weight(k, k), torch.zeros(5))
    assert torch.all(wca_weight(k * 10, k) == 1.0)  # clamped
    assert torch.allclose(cksim(k, k), torch.ones(5))
    assert torch.allclose(cksim(-k, k), -torch.ones(5))


@pytest.mark.parametrize(
    "bad",
    [
        {"plan": "x"},
        {"fusion": "x"},
        {"ratio": 1.5},
        {"boundary_k": -1},
        {"promotion": "x"},
        {"extra": -0.5},
    ],
)
def test_bad_options_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SelectiveOptions(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"extra": "abc"}, "extra must be a number, got 'abc'"),
        ({"boundary_k": 1.5}, "boundary_k must be an integer, got 1.5"),
        ({"check_layer": "x"}, "check_layer must be an integer or none, got 'x'"),
        ({"probe_redo": 1}, "probe_redo must be true or false, got 1"),
        ({"ratio": True}, "ratio must be a number, got True"),
    ],
)
def test_options_of_the_wrong_type_are_named(bad: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        SelectiveOptions(**bad)  # type: ignore[arg-type]
    assert str(e.value) == needle


def test_unknown_option_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="boundary_k"):
        EngineConfig(strategy="epic", strategy_options={"epic": {"k": 3}})


def test_probe_selection_budget_and_fidelity(tiny: LoadedModel) -> None:
    pic = shifted(second_turn(tiny, "pic"))
    probed = shifted(second_turn(tiny, "rpdc", ratio=0.5, exact_prefix=False))
    selected = math.ceil(0.5 * probed.reused_tokens)
    assert probed.recomputed_tokens == pic.recomputed_tokens + selected
    expected = (pic.recomputed_tokens + selected) / probed.prompt_tokens
    assert probed.recompute_fraction == pytest.approx(expected)

    def kl_of(name: str, **o: object) -> float:
        return first_token_kl_vs_full(tiny, name, **o)

    assert kl_of("rpdc", ratio=1.0) < kl_of("pic")
    # the ablation spends the same budget on other tokens
    ablation = shifted(second_turn(tiny, "rpdc", ratio=0.5, exact_prefix=False, selection="random"))
    assert ablation.recomputed_tokens == probed.recomputed_tokens
    assert 0.0 < kl_of("rpdc", ratio=0.5, selection="random") < kl_of("pic")


def test_exact_prefix_is_not_recomputed(tiny: LoadedModel) -> None:
    stats = shifted(second_turn(tiny, "rpdc", ratio=1.0))
    engine = Engine(tiny)
    prompt = engine.tokenize(agent_prompt("memory v2 is longer than before " * 5))
    system = prompt.segments[0]
    assert system.kind == "system"
    # everything but the unchanged system prefix and the update's opening after it (its
    # head) is recomputed at ratio 1.0
    head = update_head(engine, "memory v1", SHIFTED)
    assert stats.recomputed_tokens == prompt.num_tokens - len(system.ids) - head


def test_probe_with_zero_budget_equals_pic_compute(tiny: LoadedModel) -> None:
    pic = shifted(second_turn(tiny, "pic"))
    zero = shifted(second_turn(tiny, "rpdc", ratio=0.0, exact_prefix=False))
    assert zero.recomputed_tokens == pic.recomputed_tokens
    assert zero.recompute_fraction == pytest.approx(pic.recompute_fraction)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (9, 3)])
def test_fast_attention_probs_agree_with_reference(heads: int, kv_heads: int) -> None:
    g = torch.Generator().manual_seed(heads)
    t, w = 50, 12
    q = torch.randn(w, heads, 8, generator=g)
    keys = torch.randn(t, kv_heads, 8, generator=g)
    q_idx = torch.sort(torch.randperm(t, generator=g)[:w]).values  # scattered causal queries
    fast = attention_probs(q, q_idx, keys, 0.35)
    ref = attention_probs_reference(q, q_idx, keys, 0.35)
    assert fast.shape == ref.shape == (heads, w, t)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-7)
    assert float(fast[:, 0, int(q_idx[0]) + 1 :].abs().sum()) == 0.0  # nothing after the query


def test_extra_budget_counts_the_always_computed_tokens(tiny: LoadedModel) -> None:
    pic = shifted(second_turn(tiny, "pic"))
    extra = shifted(second_turn(tiny, "rpdc", extra=0.5, exact_prefix=False))
    selected = min(pic.reused_tokens, math.ceil(0.5 * pic.recomputed_tokens))
    assert selected > 0
    assert extra.recomputed_tokens == pic.recomputed_tokens + selected


def test_default_rpdc_budget_is_extra_and_a_given_ratio_replaces_it(tiny: LoadedModel) -> None:
    engine = Engine(tiny)
    default = engine.strategy("rpdc").options  # type: ignore[attr-defined]
    assert (default.extra, default.ratio) == (0.2, 0.0)
    with_ratio = Engine(tiny, EngineConfig(strategy_options={"rpdc": {"ratio": 0.3}}))
    options = with_ratio.strategy("rpdc").options  # type: ignore[attr-defined]
    assert (options.extra, options.ratio) == (0.0, 0.3)
    with pytest.raises(ValueError, match="alternative budgets"):
        SelectiveOptions(ratio=0.3, extra=0.2)


def test_probe_redo_with_every_token_selected_is_exact(tiny: LoadedModel) -> None:
    """Every reused token selected: with the probe layers redone for the tokens after the first
    selected one, the prefill is full recompute; without, those tokens keep probe-layer states
    computed over the cached K/V, and the output differs."""
    reference = {"ratio": 1.0, "probe_shortcut": False}  # the probe runs though all are taken
    redo = first_token_kl_vs_full(tiny, "rpdc", probe_redo=True, **reference)
    no_redo = first_token_kl_vs_full(tiny, "rpdc", **reference)
    assert redo < 1e-9
    assert no_redo > 1e3 * max(redo, 1e-12)


def test_probe_redo_counts_the_redone_token_layers(tiny: LoadedModel) -> None:
    plain = shifted(second_turn(tiny, "rpdc", ratio=0.5))
    redo = shifted(second_turn(tiny, "rpdc", ratio=0.5, probe_redo=True))
    assert redo.recomputed_tokens == plain.recomputed_tokens  # the same tokens, more layers
    assert redo.recompute_fraction > plain.recompute_fraction


def test_budget_covering_every_candidate_skips_the_probe_and_is_exact(tiny: LoadedModel) -> None:
    """The shortcut (every candidate computed, no probe) against the probe path it replaces:
    both exact, the shortcut with fewer token-layers and no ranking pass."""
    fast = shifted(second_turn(tiny, "rpdc", ratio=1.0, probe_redo=True))
    ref = shifted(second_turn(tiny, "rpdc", ratio=1.0, probe_redo=True, probe_shortcut=False))
    assert fast.probe_skipped and not ref.probe_skipped
    assert fast.recomputed_tokens == ref.recomputed_tokens
    assert fast.recompute_fraction < ref.recompute_fraction
    for options in ({}, {"probe_redo": True}):
        kl_fast = first_token_kl_vs_full(tiny, "rpdc", ratio=1.0, **options)  # type: ignore[arg-type]
        assert kl_fast < 1e-9


def shifted_prefill(tiny: LoadedModel, name: str, **options: object) -> PrefillResult:
    """The shifted second turn's prefill alone (its stats and first-token logits)."""
    engine = second_turn(tiny, name, **options)
    seq, pre = engine.prefill(engine.tokenize(agent_prompt(SHIFTED)))
    seq.free()
    return pre


def test_cover_min_makes_a_turn_with_few_candidates_exact(tiny: LoadedModel) -> None:
    """`cover=0` isolates the floor. At `cover_min` = the turn's candidates every one of them is
    computed with the tokens computed anyway, no probe pass (token-layers are exactly those
    tokens through every layer), and the logits are full recompute's; one below, the probe
    ranks as with no floor at all."""
    ranked = shifted_prefill(tiny, "rpdc", cover=0.0)
    s = ranked.stats
    n, anyway, layers = s.candidates, s.computed_anyway, tiny.config.num_layers
    assert n > 0 and not s.probe_skipped and not s.exact_plan
    below = shifted_prefill(tiny, "rpdc", cover=0.0, cover_min=n - 1).stats
    assert not below.probe_skipped and not below.exact_plan
    assert below.token_layers_computed == s.token_layers_computed
    assert below.recomputed_tokens == s.recomputed_tokens < anyway + n
    at = shifted_prefill(tiny, "rpdc", cover=0.0, cover_min=n)
    assert at.stats.probe_skipped and at.stats.exact_plan
    assert at.stats.recomputed_tokens == anyway + n
    assert at.stats.token_layers_computed == (anyway + n) * layers
    engine = Engine(tiny)
    seq, full = engine.prefill(engine.tokenize(agent_prompt(SHIFTED)), strategy="full")
    seq.free()
    torch.testing.assert_close(at.logits, full.logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ranked.logits, full.logits, rtol=1e-4, atol=1e-4)


def test_the_default_floor_makes_exact_a_turn_cover_alone_would_rank(tiny: LoadedModel) -> None:
    """The default is `cover=1.5` with `cover_min=256`: a turn whose candidates are more than
    1.5 per token computed anyway, but at most 256, is ranked by the rule without its floor
    (`rpdc:cover=1.5`, the previous default) and computed whole by the default, which then
    gives full recompute's logits."""

    def prompt(update: str) -> SegmentedPrompt:  # a short history after a short update
        return SegmentedPrompt([
            Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system"),
            Segment(K.UPDATE, update, "memory", "user"),
            Segment(K.FIXED, "Earlier the user asked about trains to Lyon. " * 2, "h1", "user"),
            Segment(K.UPDATE, "Answer:", "obs", "user"),
        ])  # fmt: skip

    def turn(**options: object) -> PrefillResult:
        engine = Engine(tiny, EngineConfig(strategy="rpdc", strategy_options={"rpdc": options}))
        engine.generate(prompt("memory v1"), ONE)
        seq, pre = engine.prefill(engine.tokenize(prompt("memory v2, moved")))
        seq.free()
        return pre

    without = turn(cover=1.5)
    s = without.stats
    assert 1.5 * s.computed_anyway < s.candidates <= 256
    assert not s.probe_skipped and not s.exact_plan
    default = turn()
    assert default.stats.probe_skipped and default.stats.exact_plan
    assert default.stats.recomputed_tokens == s.computed_anyway + s.candidates
    engine = Engine(tiny)
    seq, full = engine.prefill(engine.tokenize(prompt("memory v2, moved")), strategy="full")
    seq.free()
    torch.testing.assert_close(default.logits, full.logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(without.logits, full.logits, rtol=1e-4, atol=1e-4)


def test_probe_redo_shortcut_never_costs_more_than_the_probe(tiny: LoadedModel) -> None:
    """With `probe_redo`, leaving out a few candidates can cost more than computing them (the
    redo re-runs the probe layers of the tokens after the first selected). Over a range of
    budgets, the shortcut is taken only where it is no dearer, and there it is exact."""
    taken = 0
    for ratio in (0.5, 0.8, 0.9, 0.95, 0.99):
        fast = shifted(second_turn(tiny, "rpdc", ratio=ratio, probe_redo=True, exact_prefix=True))
        ref = shifted(second_turn(tiny, "rpdc", ratio=ratio, probe_redo=True,
                                  exact_prefix=True, probe_shortcut=False))  # fmt: skip
        assert fast.recompute_fraction <= ref.recompute_fraction + 1e-12
        if fast.probe_skipped:
            taken += 1
            kl_fast = first_token_kl_vs_full(tiny, "rpdc", ratio=ratio, probe_redo=True,
                                             exact_prefix=True)  # fmt: skip
            assert kl_fast < 1e-9
        else:
            assert fast.recompute_fraction == ref.recompute_fraction
    assert taken >= 1


def test_offset_selection_fills_chunks_from_their_starts() -> None:

    from agentcache.reuse.ranking.offset import by_offset

    spans = [(0, 4), (6, 9), (9, 15)]
    candidates = torch.zeros(16, dtype=torch.bool)
    candidates[6:15] = True  # the chunk at 0 is an exact prefix: no candidate
    chosen = by_offset(spans, candidates, 5)
    # offsets 0 and 1 of both chunks, then offset 2 of the earlier chunk
    assert chosen.nonzero().flatten().tolist() == [6, 7, 8, 9, 10]
    assert int(by_offset(spans, candidates, 100).sum()) == 9
    assert not bool(by_offset(spans, candidates, 100)[:6].any())


def test_offset_selection_at_epics_token_count_is_epic(tiny: LoadedModel) -> None:
    """With the budget epic spends (the first k of each non-first chunk, every chunk longer
    than k), the offset order picks the same tokens: the same prefill."""
    k = 8
    engine = second_turn(tiny, "pic")
    prompt = engine.tokenize(agent_prompt(SHIFTED))
    fixed = [s for s in prompt.segments if s.kind == "fixed"]
    assert all(len(s.ids) > k for s in fixed)
    n = sum(len(s.ids) for s in fixed)  # candidates: the system prompt is an exact prefix
    ratio = (k * len(fixed) - 0.5) / n
    # both told exact runs (the update's head is one), which the default knows
    epic = second_turn(tiny, "epic", boundary_k=k, exact_prefix=True)
    epic = epic.generate(agent_prompt(SHIFTED), ONE)
    offset = second_turn(tiny, "rpdc", selection="offset", ratio=ratio)
    out = offset.generate(agent_prompt(SHIFTED), ONE)
    assert out.stats.recomputed_tokens == epic.stats.recomputed_tokens
    assert out.stats.recompute_fraction == pytest.approx(epic.stats.recompute_fraction)
    torch.testing.assert_close(out.first_token_logits, epic.first_token_logits)


def test_per_chunk_budget_with_offset_order_is_epic(tiny: LoadedModel) -> None:
    """`per_chunk=k` spends EPIC's own token count: in offset order, EPIC's prefill (both
    told exact runs, as the default is)."""
    epic = second_turn(tiny, "epic", boundary_k=8, exact_prefix=True)
    epic = epic.generate(agent_prompt(SHIFTED), ONE)
    same = second_turn(tiny, "rpdc", selection="offset", per_chunk=8)
    out = same.generate(agent_prompt(SHIFTED), ONE)
    assert out.stats.recomputed_tokens == epic.stats.recomputed_tokens
    assert out.stats.recompute_fraction == pytest.approx(epic.stats.recompute_fraction)
    torch.testing.assert_close(out.first_token_logits, epic.first_token_logits)
    # the probe ranking at the same count computes as many tokens, chosen otherwise
    probed = second_turn(tiny, "rpdc", per_chunk=8, probe_shortcut=False)
    assert probed.generate(agent_prompt(SHIFTED), ONE).stats.recomputed_tokens == (
        epic.stats.recomputed_tokens
    )


def test_epic_token_count_stays_inside_each_segment() -> None:
    from types import SimpleNamespace

    from agentcache.reuse.budget import epic_tokens

    hits = [
        SimpleNamespace(start=s, num_tokens=n, exact=False) for s, n in ((0, 4), (6, 3), (9, 6))
    ]
    candidates = torch.zeros(16, dtype=torch.bool)
    candidates[6:15] = True
    assert epic_tokens(hits, candidates, 4) == 3 + 4  # type: ignore[arg-type]
    assert epic_tokens(hits, candidates, 100) == 9  # type: ignore[arg-type]
    candidates[9] = False  # already computed (a boundary token, say): not counted again
    assert epic_tokens(hits, candidates, 4) == 3 + 3  # type: ignore[arg-type]


def test_span_chunks_join_segments_stored_together(tiny: LoadedModel) -> None:
    """h1 and h2 were computed together on the first turn and follow each other again: one
    span, whose offsets run from h1's start on. A segment stored from another prompt starts a
    span of its own."""
    from agentcache.reuse.ranking.offset import by_offset
    from agentcache.reuse.runs import chunk_spans, reused_runs
    from agentcache.reuse.segments import find_hits

    engine = second_turn(tiny, "pic")
    prompt = engine.tokenize(agent_prompt(SHIFTED))
    stats = ReuseStats(prompt.num_tokens, tiny.config.num_layers)
    hits = find_hits(engine.ctx, prompt, stats)
    # the update's opening is found too: its head, stored right after the system prompt
    assert [h.segment.segment.id for h in hits] == ["sys", "memory", "h1", "h2"]
    sys, head, h1, h2 = hits
    assert head.head and not any(h.head for h in (sys, h1, h2))
    natural = torch.arange(prompt.num_tokens)

    def chunks(hits: list[Any], merge: bool) -> list[tuple[int, int]]:
        return chunk_spans(reused_runs(prompt, hits, natural, SelectiveOptions()), merge)

    assert chunks(hits, merge=False) == [(h.start, h.end) for h in hits]
    assert chunks(hits, merge=True) == [(sys.start, head.end), (h1.start, h2.end)]
    # h2 stored after a different h1: its own span
    other = replace(h2, kv=replace(h2.kv, context_id="another prompt"))
    assert chunks([sys, head, h1, other], merge=True) == [
        (sys.start, head.end), (h1.start, h1.end), (h2.start, h2.end)
    ]  # fmt: skip

    # offset order from the span's start: h1's first tokens, then on into h2
    spans, segments = ({"selection": "offset", "per_chunk": 8, "chunks": c} for c in CHUNK_KINDS)
    by_span = second_turn(tiny, "rpdc", **spans).generate(agent_prompt(SHIFTED), ONE)
    by_segment = second_turn(tiny, "rpdc", **segments).generate(agent_prompt(SHIFTED), ONE)
    assert by_span.stats.recomputed_tokens == by_segment.stats.recomputed_tokens
    assert not torch.equal(by_span.first_token_logits, by_segment.first_token_logits)
    candidates = torch.zeros(prompt.num_tokens, dtype=torch.bool)
    candidates[h1.start : h2.end] = True
    chosen = by_offset(chunks(hits, merge=True), candidates, 16)
    assert chosen.nonzero().flatten().tolist() == list(range(h1.start, h1.start + 16))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"per_chunk": 8, "ratio": 0.1}, "alternative budgets"),
        ({"per_chunk": -1}, "per_chunk must be >= 0"),
        ({"chunks": "message"}, "chunks must be one of"),
        ({"extra": 0.5}, "needs a ranking"),  # pic's settings: nothing would spend it
        ({"per_chunk": 64, "boundary_k": 64}, "needs a ranking"),
    ],
)
def test_bad_budget_and_chunk_options_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SelectiveOptions(**options)  # type: ignore[arg-type]


def test_starts_compute_each_moved_runs_first_tokens_beside_the_ranked_budget(
    tiny: LoadedModel,
) -> None:
    """On a ranked turn (`cover=0`), `starts=4` computes the first 4 tokens of each of the two
    moved history segments through every layer, besides the same ranked budget; the turn
    stays ranked, and its first-token distribution moves toward full recompute's."""
    plain = shifted_prefill(tiny, "rpdc", cover=0.0)
    starts = shifted_prefill(tiny, "rpdc", cover=0.0, starts=4)
    p, s = plain.stats, starts.stats
    assert not p.probe_skipped and not s.probe_skipped and not s.exact_plan
    assert s.computed_anyway == p.computed_anyway + 2 * 4
    assert s.candidates == p.candidates - 2 * 4
    assert s.recomputed_tokens == p.recomputed_tokens + 2 * 4
    engine = Engine(tiny)
    seq, full = engine.prefill(engine.tokenize(agent_prompt(SHIFTED)), strategy="full")
    seq.free()
    assert not torch.allclose(starts.logits, plain.logits, rtol=1e-4, atol=1e-4)
    gap = [(r.logits - full.logits).abs().max().item() for r in (plain, starts)]
    assert gap[1] < gap[0]


def test_epic_over_runs_epics_plan_without_a_probe(tiny: LoadedModel) -> None:
    """A ranked turn (`cover=0`) whose candidates outnumber its computed tokens, at
    `epic_over=0.5`: no probe runs, the turn computes the first 4 tokens of each moved segment
    with the tokens computed anyway, and its logits, tokens and token-layers are those of
    `epic:exact_prefix=true:boundary_k=4`, the reference path that plans the same tokens."""
    ranked = shifted_prefill(tiny, "rpdc", cover=0.0).stats
    assert ranked.candidates > 0.5 * ranked.computed_anyway and not ranked.epic_turn
    fast = shifted_prefill(tiny, "rpdc", cover=0.0, epic_over=0.5, epic_k=4)
    ref = shifted_prefill(tiny, "epic", exact_prefix=True, boundary_k=4)
    s, r = fast.stats, ref.stats
    assert s.epic_turn and not s.probe_skipped and not s.exact_plan and not r.epic_turn
    assert s.recomputed_tokens == s.computed_anyway == r.recomputed_tokens
    assert s.computed_anyway > ranked.computed_anyway
    assert s.token_layers_computed == r.token_layers_computed
    assert s.token_layers_computed == s.recomputed_tokens * tiny.config.num_layers
    torch.testing.assert_close(fast.logits, ref.logits, rtol=1e-5, atol=1e-5)
    off = shifted_prefill(tiny, "rpdc", cover=0.0, epic_over=1e6, epic_k=4).stats
    assert not off.epic_turn and off.recomputed_tokens == ranked.recomputed_tokens


def test_an_up_front_ranking_is_an_exact_plan_only_when_it_computes_every_candidate(
    tiny: LoadedModel,
) -> None:
    """An up-front ranker's picks join the tokens computed anyway, leaving no candidates to a
    pass: `exact_plan` still says whether every reused token whose KV is not exact ran (at
    ratio 1 it did, and the logits are full recompute's; at 0.3 fewer tokens ran)."""
    part = shifted_prefill(tiny, "pic", selection="offset", ratio=0.3, exact_prefix=True)
    every = shifted_prefill(tiny, "pic", selection="offset", ratio=1.0, exact_prefix=True)
    assert every.stats.exact_plan and not part.stats.exact_plan
    assert part.stats.recomputed_tokens < every.stats.recomputed_tokens
    engine = Engine(tiny)
    seq, full = engine.prefill(engine.tokenize(agent_prompt(SHIFTED)), strategy="full")
    seq.free()
    torch.testing.assert_close(every.logits, full.logits, rtol=1e-4, atol=1e-4)
