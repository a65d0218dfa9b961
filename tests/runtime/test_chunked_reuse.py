"""Chunked prefill of reuse plans (`ReuseStrategy.plan_prefill`, `runtime/chunked.py`): exact
prefix reuse's plan and the selective plans known up front run their computed tokens in chunks
after loading the rest, and agree with the whole prefill: first-token logits and K/V to fp32
rounding, the same counted work and bookkeeping (what is stored, so the next turn's hits),
the same greedy ids. A plan that needs its probe still runs whole. Counted, never timed.

    1 FIRST : [ sys t1 ][ tools ][ q1 ]        nothing found: every token computed
    2 SETUP : [ sys t2 ][ tools ][ long q2 ]   rpdc: tools found, all computed (cover): exact
    3 THEN  : [ sys t2 ][ tools ][ q3 ]        prefix: blocks; rpdc: the exact copy
    4 AGAIN : THEN once more                   what 3 stored: every block / segment found
"""

from __future__ import annotations

from dataclasses import astuple, replace
from typing import Any

import pytest
import torch

from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt import SegmentedPrompt
from agentcache.reuse.base import PlannedPrefill
from agentcache.reuse.segments import exact_left
from agentcache.runtime import chunked
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams, TurnStats
from tests.reuse.test_exact_copies import FIRST, SETUP, THEN, prompt
from tests.runtime.test_chunked import ATOL

CHUNK = 8
PARAMS = GenerationParams(max_new_tokens=6)
TURNS = (FIRST, SETUP, THEN, THEN)


def engine(model: LoadedModel, strategy: str, chunk: int, **options: Any) -> Engine:
    config = EngineConfig(strategy=strategy, batch_decode=True, prefill_chunk_tokens=chunk,
                          strategy_options={strategy: options} if options else {})  # fmt: skip
    return Engine(model, config)


def counted(s: TurnStats) -> dict[str, Any]:
    """A turn's counted work and bookkeeping, model calls aside (one set per chunk)."""
    return {
        "reused": s.reused_tokens, "recomputed": s.recomputed_tokens,
        "loaded": s.loaded_tokens, "fraction": s.recompute_fraction,
        "exact_plan": s.exact_plan, "probe_skipped": s.probe_skipped,
        "token_reuse": s.token_reuse, "context_copy_tokens": s.context_copy_tokens,
        "guarded": s.guarded, "plan_cost": s.plan_cost, "fallbacks": s.fallback_reasons,
        "misses": s.misses,
    }  # fmt: skip


def chunks(n: int) -> int:
    """Chunks a plan computing `n` tokens runs as (0: one chunk or less runs whole)."""
    return -(-n // CHUNK) if n > CHUNK else 0


@pytest.mark.parametrize("strategy", ["prefix", "rpdc"])
def test_chunked_turns_do_the_whole_prefills_work(tiny: LoadedModel, strategy: str) -> None:
    """Turn by turn: the same greedy ids, first-token logits to fp32 rounding, counted work,
    store afterwards (so the next turn finds the same), and every turn ran in chunks."""
    whole, split = engine(tiny, strategy, 0), engine(tiny, strategy, CHUNK)
    assert whole.batch is not None and split.batch is not None
    layers = tiny.config.num_layers
    for i, p in enumerate(TURNS):
        before = split.batch.stats().prefill_chunks
        want, got = whole.generate(p, PARAMS), split.generate(p, PARAMS)
        assert got.token_ids == want.token_ids, i
        torch.testing.assert_close(got.first_token_logits, want.first_token_logits,
                                   atol=ATOL, rtol=0)  # fmt: skip
        w, g = want.stats, got.stats
        assert counted(g) == counted(w), i
        assert astuple(split.store.stats) == astuple(whole.store.stats), i
        n = chunks(w.recomputed_tokens)
        assert n > 0 or i == 3, i  # the first three compute more than one chunk
        assert split.batch.stats().prefill_chunks - before == n, i
        assert w.model_calls == 2 + 2 * layers  # no probe: one pass over the computed tokens
        assert g.model_calls == n * w.model_calls, i
        if i >= 2:  # found: prefix's blocks / rpdc's exact copy, loaded not computed
            assert g.loaded_tokens > 0 and g.loaded_tokens + g.recomputed_tokens <= w.prompt_tokens
    assert whole.batch.stats().prefill_chunks == 0
    last = counted(want.stats)
    if strategy == "rpdc":
        assert last["exact_plan"]  # the exact copy: full recompute's output, up to rounding
    assert last["loaded"] > 0


def one_prefill(
    e: Engine, strategy: str, p: SegmentedPrompt, chunk: int | None
) -> tuple[Any, SequenceKV, int]:
    """`strategy`'s prefill of `p` on `e`: whole (`chunk` None), or as chunks run one after
    another; its result, the sequence and how many chunks ran."""
    t, seq, strat = e.tokenize(p), SequenceKV(e.ctx.pool), e.strategy(strategy)
    with torch.inference_mode():
        if chunk is None:
            return strat.prefill(e.ctx, t, seq), seq, 0
        work = chunked.plan(strat, e.ctx, t, seq, chunk)
        assert isinstance(work, chunked.ChunkedPrefill)
        return work.run_all(), seq, work.num_chunks


@pytest.mark.parametrize("strategy", ["prefix", "rpdc"])
@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunks_of_a_reuse_plan_agree_with_the_whole_plan(
    tiny: LoadedModel, strategy: str, chunk: int
) -> None:
    """After FIRST and SETUP, THEN's plan: the same K/V in every layer, logits, positions,
    masks and the exact K/V left for commit, as the whole plan."""
    e = engine(tiny, strategy, 0)
    for p in (FIRST, SETUP):
        e.generate(p, GenerationParams(max_new_tokens=1))
    whole, whole_seq, _ = one_prefill(e, strategy, THEN, None)
    got, seq, n = one_prefill(e, strategy, THEN, chunk)
    w, g = whole.stats, got.stats
    assert n == -(-w.recomputed_tokens // chunk) and w.loaded_tokens > 0
    torch.testing.assert_close(got.logits, whole.logits, atol=ATOL, rtol=0)
    assert int(got.logits.argmax()) == int(whole.logits.argmax())
    assert torch.equal(got.positions, whole.positions)
    for layer in range(tiny.config.num_layers):
        for a, b in zip(seq.gather(layer), whole_seq.gather(layer), strict=True):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for field in ("reused_tokens", "loaded_tokens", "recomputed_tokens", "exact_plan",
                  "probe_skipped", "copies_found", "candidates", "computed_anyway",
                  "token_layers_computed", "fallback_reasons"):  # fmt: skip
        assert getattr(g, field) == getattr(w, field), field
    for mask in ("reused", "exact", "dirty"):
        a, b = getattr(g, mask), getattr(w, mask)
        assert (a is None) == (b is None), mask
        assert a is None or torch.equal(a, b), mask
    assert g.model_calls == n * w.model_calls
    assert exact_left(seq) == exact_left(whole_seq)
    if strategy == "rpdc":
        assert g.exact_plan and exact_left(seq) is not None
    seq.free()
    whole_seq.free()


def test_a_plan_that_probes_runs_whole(tiny: LoadedModel) -> None:
    """Tools found after another stamp, a short question: rpdc's probe ranks them (without
    `epic_over`, which would compute their chunk starts instead: test below), so its plan
    is not known up front; it runs whole (no chunk), as the engine without chunks runs it."""
    short = prompt(2, "Item 5?")
    whole = engine(tiny, "rpdc", 0, epic_over=0.0)
    split = engine(tiny, "rpdc", CHUNK, epic_over=0.0)
    assert split.batch is not None
    for p in (FIRST, short):
        before = split.batch.stats().prefill_chunks
        want, got = whole.generate(p, PARAMS), split.generate(p, PARAMS)
        after = split.batch.stats().prefill_chunks
        assert got.token_ids == want.token_ids
        assert counted(got.stats) == counted(want.stats)
        assert astuple(split.store.stats) == astuple(whole.store.stats)
        if p is short:
            assert not got.stats.exact_plan and not got.stats.probe_skipped
            assert got.stats.model_calls == want.stats.model_calls  # one unit, with its probe
            assert got.stats.model_calls > 2 + 2 * tiny.config.num_layers
            assert after == before  # no chunk ran
            # FIRST's stored K/V came from chunks: equal to the whole prefill's to rounding
            torch.testing.assert_close(got.first_token_logits, want.first_token_logits,
                                       atol=ATOL, rtol=0)  # fmt: skip
        else:
            assert after > before
    # the same prompt again, its context copy (test_context_copies.py) not used: it probes
    seq, ctx = SequenceKV(split.ctx.pool), replace(split.ctx, context_copies=False)
    with torch.inference_mode():
        out = chunked.plan(split.strategy("rpdc"), ctx, split.tokenize(short), seq, CHUNK)
    assert not isinstance(out, chunked.ChunkedPrefill) and not out.stats.exact_plan
    assert out.stats.model_calls == want.stats.model_calls
    seq.free()


def test_chunk_starts_on_a_thin_turn_are_planned_up_front_and_run_in_chunks(
    tiny: LoadedModel,
) -> None:
    """The probing turn above, again without its context copy, under the default
    (`epic_over=4`): its candidates now far outnumber the tokens it computes anyway, so it
    computes their chunk starts, known before any layer runs, and runs in chunks, with the
    whole prefill's tokens computed and its first-token logits to fp32 rounding."""
    short = prompt(2, "Item 5?")
    e = engine(tiny, "rpdc", CHUNK)
    for p in (FIRST, short):
        e.generate(p, PARAMS)
    ctx, t = replace(e.ctx, context_copies=False), e.tokenize(short)
    runs = []
    with torch.inference_mode():
        for chunk in (CHUNK, None):
            seq = SequenceKV(e.ctx.pool)
            if chunk is None:
                runs.append((e.strategy("rpdc").prefill(ctx, t, seq), 0))
            else:
                work = chunked.plan(e.strategy("rpdc"), ctx, t, seq, chunk)
                assert isinstance(work, chunked.ChunkedPrefill)
                runs.append((work.run_all(), work.num_chunks))
            seq.free()
    (split, n), (whole, _) = runs
    assert n > 1 and split.stats.epic_turn and whole.stats.epic_turn
    assert not split.stats.exact_plan and not split.stats.probe_skipped
    assert split.stats.recomputed_tokens == whole.stats.recomputed_tokens
    assert whole.stats.model_calls == 2 + 2 * tiny.config.num_layers  # no probe pass
    torch.testing.assert_close(split.logits, whole.logits, atol=ATOL, rtol=0)


def test_plan_prefill_hands_over_before_any_layer_runs(tiny: LoadedModel) -> None:
    """The handed-over plan has loaded, not computed: no model call yet; run whole it is
    `prefill`'s result."""
    e = engine(tiny, "prefix", 0)
    e.generate(FIRST, GenerationParams(max_new_tokens=1))
    t = e.tokenize(FIRST)
    seq = SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        planned = e.strategy("prefix").plan_prefill(e.ctx, t, seq)
        assert isinstance(planned, PlannedPrefill)
        assert planned.stats.model_calls == 0 and planned.stats.loaded_tokens > 0
        assert seq.num_tokens == t.num_tokens
        assert planned.stats.loaded_tokens + len(planned.computed) == t.num_tokens
        got = planned.run(e.ctx, t, seq)
    assert got.stats.model_calls == 2 + 2 * tiny.config.num_layers
    seq.free()


def test_a_strategy_that_plans_nothing_runs_whole(tiny: LoadedModel) -> None:
    """A strategy without `plan_prefill` (the default): `chunked.plan` returns its result."""
    e = engine(tiny, "promptcache", 0)
    seq = SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        out = chunked.plan(e.strategy("promptcache"), e.ctx, e.tokenize(FIRST), seq, 4)
    assert not isinstance(out, chunked.ChunkedPrefill)
    assert out.stats.recomputed_tokens == e.tokenize(FIRST).num_tokens
    seq.free()


def test_a_guarded_selective_plan_runs_fulls_plan_in_chunks(tiny: LoadedModel) -> None:
    """cacheblend computing every candidate costs more than full recompute: the guard runs
    `full`'s plan, in chunks, with the whole prefill's counts and commit (its exact copy)."""
    options = {"cacheblend": {"ratio": 1.0}}
    engines = [
        Engine(tiny, EngineConfig(strategy="cacheblend", strategy_options=options,
                                  batch_decode=True, prefill_chunk_tokens=chunk))
        for chunk in (0, CHUNK)
    ]  # fmt: skip
    whole, split = engines
    assert split.batch is not None
    short = prompt(2, "Item 5?")
    for p in (FIRST, short):
        before = split.batch.stats().prefill_chunks
        want, got = whole.generate(p, PARAMS), split.generate(p, PARAMS)
        assert got.token_ids == want.token_ids
        assert counted(got.stats) == counted(want.stats)
        assert astuple(split.store.stats) == astuple(whole.store.stats)
        n = chunks(want.stats.recomputed_tokens)
        assert n > 0 and split.batch.stats().prefill_chunks - before == n
    assert got.stats.guarded and got.stats.recomputed_tokens == got.stats.prompt_tokens
