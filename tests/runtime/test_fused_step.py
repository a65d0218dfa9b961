"""The fused step (`batch_step.fused_step`): a prefill chunk's rows beside the decode rows in
one batch through the projections and MLPs, attention per sequence. Against the references:
the chunk run on its own (`ChunkedPrefill.run_chunk`) and the decode batch without it
(`batched_dense_step`). In the scheduler: which chunks fuse, counted, and every request's
greedy ids those it gets alone. Counted, never timed."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    PlannedPrefill,
    PrefillResult,
    ReuseStats,
    compute_subset,
    natural_plan,
)
from agentcache.runtime import chunked
from agentcache.runtime.batch_step import ChunkRows, batched_dense_step, fused_step
from agentcache.runtime.engine import Engine, Generation, GenerationParams
from agentcache.testing import tiny_family_model, tiny_model
from tests.conftest import at_once
from tests.runtime.test_batch_step import LENGTHS, prefilled
from tests.runtime.test_chunked import ATOL, KV_PAGES, engine, prompt


def decoding(model: LoadedModel, e: Engine, b: int) -> tuple[list[SequenceKV], list[int]]:
    """`b` sequences of different lengths in `e`'s pool, and each one's next token."""
    made = [prefilled(model, e.ctx.pool, n, n) for n in LENGTHS[:b]]
    return [s for s, _ in made], [t for _, t in made]


def decode_rows(seqs: list[SequenceKV]) -> tuple[torch.Tensor, list[int]]:
    """Each sequence extended by its next token's slot; the slots and positions."""
    positions = [s.num_tokens for s in seqs]
    return torch.cat([torch.zeros(0, dtype=torch.int64), *(s.extend(1) for s in seqs)]), positions


def reference_chunks(
    e: Engine, tokens: TokenizedPrompt, chunk: int
) -> tuple[PrefillResult, SequenceKV]:
    """`full`'s prefill of `tokens` as chunks of `chunk` tokens through `compute_subset`, one
    after another: the one-sequence path, the reference; its result and sequence."""
    seq = SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        planned = natural_plan(e.ctx, tokens, seq)
        for start in range(0, tokens.num_tokens, chunk):
            idx = planned.computed[start : start + chunk]
            logits = compute_subset(e.ctx, tokens, seq, idx, planned.stats)
        return planned.finish(logits), seq


@pytest.mark.parametrize(("family", "b", "chunk"),
                         [("llama", 1, 8), ("llama", 3, 5), ("llama", 4, 16),
                          ("qwen2-window", 2, 8), ("qwen3", 5, 13)])  # fmt: skip
def test_a_fused_chunk_agrees_with_the_one_sequence_path(family: str, b: int, chunk: int) -> None:
    """A whole prompt's chunks, each fused beside `b` decoding sequences: the prompt's K/V
    and first-token logits agree with its chunks run through `compute_subset` to fp32
    rounding, with the same counted work, and are the bits its chunks get run on their own
    (`run_chunk`: nothing beside them); the decode rows are the bits of the batch without
    the chunk."""
    model = tiny_model() if family == "llama" else tiny_family_model(family)
    e = engine(model, 0)
    f, tokens, full = model.forward, e.tokenize(prompt(10)), e.strategy("full")
    want, want_seq = reference_chunks(e, tokens, chunk)
    seqs, next_tokens = decoding(model, e, b)
    twins, _ = decoding(model, e, b)
    alone_seq, fused_seq = SequenceKV(e.ctx.pool), SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        alone = chunked.plan(full, e.ctx, tokens, alone_seq, chunk)
        fused = chunked.plan(full, e.ctx, tokens, fused_seq, chunk)
        assert isinstance(alone, chunked.ChunkedPrefill)
        assert isinstance(fused, chunked.ChunkedPrefill) and fused.fusable
        by_itself = alone.run_all()
        got: PrefillResult | None = None
        steps = 0
        while got is None:
            slots, positions = decode_rows(seqs)
            twin_slots, _ = decode_rows(twins)
            rows = fused.next_rows()
            logits, last = fused_step(f, seqs, slots, next_tokens, positions, [rows])
            ref = batched_dense_step(f, twins, twin_slots, next_tokens, positions)
            assert torch.equal(logits, ref)  # the decode rows: the same bits beside a chunk
            got = fused.take_fused(last[0], 0.0)
            next_tokens = logits.argmax(-1).tolist()
            steps += 1
    assert steps == alone.num_chunks > 1
    torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
    assert int(got.logits.argmax()) == int(want.logits.argmax())
    assert torch.equal(got.logits, by_itself.logits)
    assert torch.equal(got.positions, want.positions)
    for layer in range(model.config.num_layers):
        kv = fused_seq.gather(layer)
        for a, r, o in zip(kv, want_seq.gather(layer), alone_seq.gather(layer), strict=True):
            torch.testing.assert_close(a, r, atol=ATOL, rtol=0)
            assert torch.equal(a, o)
        for s, t in zip(seqs, twins, strict=True):
            pairs = zip(s.gather(layer), t.gather(layer), strict=True)
            assert all(torch.equal(x, y) for x, y in pairs)
    g, ws = got.stats, want.stats
    assert (g.recomputed_tokens, g.token_layers_computed, g.model_calls) == (
        ws.recomputed_tokens, ws.token_layers_computed, ws.model_calls)  # fmt: skip


def test_two_chunks_of_two_prompts_fuse_in_one_step(tiny: LoadedModel) -> None:
    """Two prefills' chunks in one fused step with no decode row: each agrees with its own
    chunks run alone (each attends over its own sequence only)."""
    e = engine(tiny, 0)
    full = e.strategy("full")
    prompts = [e.tokenize(prompt(n, who)) for n, who in ((3, "clerk"), (7, "pilot"))]
    with torch.inference_mode():
        alone = [chunked.plan(full, e.ctx, t, SequenceKV(e.ctx.pool), 8) for t in prompts]
        works = [chunked.plan(full, e.ctx, t, SequenceKV(e.ctx.pool), 8) for t in prompts]
        wants = [a.run_all() for a in alone if isinstance(a, chunked.ChunkedPrefill)]
        gots: list[PrefillResult | None] = [None, None]
        live = [w for w in works if isinstance(w, chunked.ChunkedPrefill)]
        assert len(live) == len(wants) == 2
        while any(g is None for g in gots):
            pending = [i for i in range(2) if gots[i] is None]
            rows = [live[i].next_rows() for i in pending]
            decode, last = fused_step(tiny.forward, [], torch.zeros(0, dtype=torch.int64),
                                      [], [], rows)  # fmt: skip
            assert decode.numel() == 0
            for i, logits in zip(pending, last, strict=True):
                gots[i] = live[i].take_fused(logits, 0.0)
    for got, want in zip(gots, wants, strict=True):
        assert got is not None
        torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
        assert int(got.logits.argmax()) == int(want.logits.argmax())


def test_a_fused_step_refuses_what_it_cannot_run(tiny: LoadedModel) -> None:
    e = engine(tiny, 0)
    none = torch.zeros(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="a decode row or a chunk"):
        fused_step(tiny.forward, [], none, [], [], [])
    seq = SequenceKV(e.ctx.pool)
    seq.extend(4)
    bad = ChunkRows(seq, torch.tensor([1, 2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="one index per token"):
        fused_step(tiny.forward, [], none, [], [], [bad])


def long_decode_then(e: Engine, others: list[tuple[SegmentedPrompt, GenerationParams]],
                     first: GenerationParams) -> list[Generation]:  # fmt: skip
    """Turn 0 decodes `first`'s tokens; once it has its second token (it decodes in the
    batch), the `others` start, so their chunks run in steps that also feed turn 0."""
    decoding_now = threading.Event()
    tokens = itertools.count(1)

    def on_token(_: int) -> None:
        if next(tokens) == 2:
            decoding_now.set()

    def turn(i: int) -> Generation:
        if i == 0:
            return e.generate(prompt(2, "clerk"), first, "full", commit=False,
                              on_token=on_token)  # fmt: skip
        decoding_now.wait()
        p, params = others[i - 1]
        return e.generate(p, params, "full", commit=False)

    return at_once(turn, 1 + len(others))


def test_concurrent_requests_with_stop_strings_get_their_solo_ids(tiny: LoadedModel) -> None:
    """A long decode and three prompts of different lengths and stop strings, their chunks
    fused beside the decoding turns: every request's ids, text and finish reason are those
    it gets alone (its chunks then run on their own, its decode one row at a time)."""
    e = engine(tiny, 8)
    assert e.batch is not None
    first = GenerationParams(max_new_tokens=90)
    prompts = [prompt(14), prompt(5, "pilot"), prompt(9, "judge")]
    stops: list[GenerationParams] = []
    for p, n in zip(prompts, (12, 30, 20), strict=True):  # a stop string met in the reply
        text = e.generate(p, GenerationParams(max_new_tokens=n), "full", commit=False).text
        stops.append(GenerationParams(max_new_tokens=n, stop=(text[n // 2 : n // 2 + 3],)))
    others = list(zip(prompts, stops, strict=True))
    solo = [e.generate(prompt(2, "clerk"), first, "full", commit=False)]
    solo += [e.generate(p, params, "full", commit=False) for p, params in others]
    assert len(solo[0].token_ids) == 90 and any(s.finish_reason == "stop" for s in solo[1:])
    before = e.batch.stats()
    together = long_decode_then(e, others, first)
    after = e.batch.stats()
    for s, t in zip(solo, together, strict=True):
        assert (t.token_ids, t.text, t.finish_reason) == (s.token_ids, s.text, s.finish_reason)
    fused = after.fused_chunks - before.fused_chunks
    assert fused > 0
    assert after.prefill_chunks - before.prefill_chunks == fused + (
        after.separate_chunks - before.separate_chunks)  # fmt: skip
    assert e.ctx.pool.num_free == KV_PAGES


def scattered_plan(e: Engine, p: SegmentedPrompt) -> tuple[chunked.ChunkedPrefill, PrefillResult]:
    """A plan shaped as a selective one's: tokens [40, 80) loaded (copied from the whole
    prefill), the others computed in chunks of 8; and the whole prefill's result."""
    t, full = e.tokenize(p), e.strategy("full")
    ref, seq = SequenceKV(e.ctx.pool), SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        whole = full.prefill(e.ctx, t, ref)
        seq.extend(t.num_tokens)
        keys, values = ref.gather_all(slice(40, 80))
        seq.write_all(seq.slots()[40:80], keys, values)
    ref.free()
    computed = torch.cat([torch.arange(0, 40), torch.arange(80, t.num_tokens)])
    stats = ReuseStats(t.num_tokens, e.ctx.model.config.num_layers)
    planned = PlannedPrefill(computed, torch.arange(t.num_tokens), stats)
    return chunked.ChunkedPrefill(e.ctx, t, seq, planned, 8), whole


def test_chunks_of_a_scattered_plan_run_on_their_own_beside_decoding(tiny: LoadedModel) -> None:
    """A plan computing tokens on both sides of loaded ones does not fuse: its chunks run as
    their own forwards (counted separate) in steps that also feed a decoding turn, and its
    result is the whole prefill's to fp32 rounding."""
    e = engine(tiny, 8)
    assert e.batch is not None
    work, whole = scattered_plan(e, prompt(14))
    assert not work.fusable
    first = GenerationParams(max_new_tokens=80)
    decoding_now, tokens = threading.Event(), itertools.count(1)

    def on_token(_: int) -> None:
        if next(tokens) == 2:
            decoding_now.set()

    def turn(i: int) -> object:
        if i == 0:
            return e.generate(prompt(2, "clerk"), first, "full", commit=False,
                              on_token=on_token)  # fmt: skip
        decoding_now.wait()
        return e.batch.prefill(work) if e.batch is not None else None

    alone = e.generate(prompt(2, "clerk"), first, "full", commit=False)
    before = e.batch.stats()
    a, got = at_once(turn, 2)
    after = e.batch.stats()
    assert isinstance(a, Generation) and a.token_ids == alone.token_ids
    assert isinstance(got, PrefillResult)
    torch.testing.assert_close(got.logits, whole.logits, atol=ATOL, rtol=0)
    assert int(got.logits.argmax()) == int(whole.logits.argmax())
    assert after.fused_chunks == before.fused_chunks
    a_chunks = -(-e.tokenize(prompt(2, "clerk")).num_tokens // 8)  # run before A decoded
    assert after.separate_chunks - before.separate_chunks == work.num_chunks + a_chunks
    assert after.mixed_steps - before.mixed_steps >= work.num_chunks // 2  # beside decoding
    work.seq.free()
