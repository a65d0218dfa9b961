"""The batched decode step against the one-sequence step (`decode.dense.dense_step`), and the
row invariance it rests on: a sequence's logits are the same bits in any batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentcache.decode.dense import dense_step
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.runtime.batch_step import (
    ANY_MULTIPLE,
    FIXED,
    FROM_CHUNK,
    ROW_CHUNK,
    CallRule,
    StepTimes,
    batched_dense_step,
    batched_step,
    call_rule,
    dense_rows,
    one_step,
)
from agentcache.testing import tiny_family_model, tiny_model

LENGTHS = (3, 17, 40, 9, 33)  # prompt tokens per sequence: pages part-filled, several spans


def prefilled(model: LoadedModel, pool: PagePool, seed: int, n: int) -> tuple[SequenceKV, int]:
    """A sequence holding `n` random tokens' KV, written one step at a time; its next token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (n + 1,), generator=g).tolist()
    seq = SequenceKV(pool)
    for i, t in enumerate(ids[:-1]):
        dense_step(model.forward, seq, t, i)
    return seq, ids[-1]


def pool_of(model: LoadedModel, pages: int = 64) -> PagePool:
    c = model.config
    return PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, pages, 16))


def batch(model: LoadedModel, lengths: tuple[int, ...]) -> tuple[list[SequenceKV], list[int]]:
    pool = pool_of(model)
    made = [prefilled(model, pool, n, n) for n in lengths]  # seeded by length: one per length
    return [s for s, _ in made], [t for _, t in made]


def step(model: LoadedModel, seqs: list[SequenceKV], tokens: list[int]) -> torch.Tensor:
    positions = [s.num_tokens for s in seqs]
    slots = torch.cat([s.extend(1) for s in seqs])
    return batched_dense_step(model.forward, seqs, slots, tokens, positions)


@pytest.mark.parametrize("family", ["llama", "qwen2-window", "qwen3"])
def test_batched_step_agrees_with_the_one_sequence_step(family: str) -> None:
    """Same logits to fp32 rounding and the same KV written, for every sequence of a batch of
    different lengths (a windowed family reads only its window's runs)."""
    model = tiny_model() if family == "llama" else tiny_family_model(family)
    seqs, tokens = batch(model, LENGTHS)
    ref_seqs, _ = batch(model, LENGTHS)
    got = step(model, seqs, tokens)
    assert got.shape == (len(LENGTHS), model.config.vocab_size)
    for i, (s, t) in enumerate(zip(ref_seqs, tokens, strict=True)):
        want = dense_step(model.forward, s, t, s.num_tokens)
        assert torch.allclose(got[i], want, atol=1e-5, rtol=0)
        assert int(got[i].argmax()) == int(want.argmax())
        k, v = seqs[i].gather(0)
        rk, rv = s.gather(0)
        assert torch.allclose(k, rk, atol=1e-5, rtol=0) and torch.allclose(v, rv, atol=1e-5)
        assert seqs[i].num_tokens == s.num_tokens == LENGTHS[i] + 1


def test_a_sequence_gets_the_same_logits_alone_and_in_any_batch(tiny: LoadedModel) -> None:
    """Bit for bit: its greedy output does not depend on what else decodes beside it, how
    many (one call of ROW_CHUNK rows or several) or where it sits among them."""
    alone = {}
    for n in LENGTHS:
        seqs, tokens = batch(tiny, (n,))
        alone[n] = step(tiny, seqs, tokens)[0]
    many = (*LENGTHS, *reversed(LENGTHS)) * 2  # 20 rows: two calls, each length twice per call
    for lengths in (LENGTHS[:2], LENGTHS[:3], LENGTHS, LENGTHS[::-1], many):
        seqs, tokens = batch(tiny, lengths)
        got = step(tiny, seqs, tokens)
        for i, n in enumerate(lengths):
            assert torch.equal(got[i], alone[n])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 576)])
def test_in_a_call_of_row_chunk_rows_a_row_does_not_depend_on_the_others_or_its_place(
    shape: tuple[int, int], threads: int
) -> None:
    """What the batched step rests on, at the default model's projection shapes: in a matmul
    of exactly ROW_CHUNK rows, each row of x @ W.T is the same bits whatever rows sit beside it
    and wherever it sits among them (a call of another size may sum in another order)."""
    torch.manual_seed(0)
    w = torch.randn(shape)
    x = torch.randn(ROW_CHUNK, shape[1])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        base = F.linear(x, w)
        for _ in range(4):
            order = torch.randperm(ROW_CHUNK)
            kept = torch.rand(ROW_CHUNK) < 0.5
            mixed = torch.where(kept[:, None], x, torch.randn(ROW_CHUNK, shape[1]))[order]
            out = F.linear(mixed, w)
            for at, row in enumerate(order.tolist()):
                if kept[row]:
                    assert torch.equal(out[at], base[row])
    finally:
        torch.set_num_threads(before)


def test_each_rule_pads_rows_into_its_calls() -> None:
    assert [ANY_MULTIPLE.calls(n) for n in (1, 4, 5, 32, 33, 70)] == [
        [4], [4], [8], [32], [32, 4], [32, 32, 8]]  # fmt: skip
    assert [FIXED.calls(n) for n in (1, 16, 17, 40)] == [[16], [16], [16, 16], [16, 16, 16]]
    assert [FROM_CHUNK.calls(n) for n in (1, 16, 17, 32, 33, 50, 70)] == [
        [16], [16], [20], [32], [32, 16], [32, 20], [32, 32, 16]]  # fmt: skip


@pytest.mark.parametrize("rule", [ANY_MULTIPLE, FROM_CHUNK, FIXED])
def test_under_either_rule_a_sequence_gets_the_same_logits_in_any_batch(
    tiny: LoadedModel, rule: CallRule, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bits alone and among 19 others (two calls or more) under each rule; the rule
    the probe picks for this machine is the one the step then uses."""
    import agentcache.runtime.batch_step as batch_step

    if rule is not FIXED and not batch_step._rows_kept_apart(batch_step._matrices(tiny.forward),
                                                             rule):  # fmt: skip
        pytest.skip("on this CPU and thread count rows change bits across the rule's call sizes")
    monkeypatch.setattr(batch_step, "call_rule", lambda forward: rule)
    alone = {n: step(tiny, *batch(tiny, (n,)))[0] for n in LENGTHS}
    many = (*LENGTHS, *reversed(LENGTHS)) * 2
    got = step(tiny, *batch(tiny, many))
    for i, n in enumerate(many):
        assert torch.equal(got[i], alone[n])


@pytest.mark.parametrize(("shared_from", "picked"),
                         [(1, ANY_MULTIPLE), (ROW_CHUNK, FROM_CHUNK), (None, FIXED)])  # fmt: skip
def test_the_probe_takes_the_widest_rule_whose_call_sizes_keep_a_rows_bits(
    tiny: LoadedModel, shared_from: int | None, picked: CallRule,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With a matmul whose row bits do not depend on the call (each row alone) the probe picks
    `ANY_MULTIPLE`; with one whose result shifts by a hair with the row count (another kernel)
    below 16 rows only, `FROM_CHUNK`; at every row count, `FIXED`. The rule is remembered per
    weight shapes and thread count."""
    import agentcache.runtime.batch_step as batch_step

    real = F.linear

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        rows = torch.cat([real(x[i : i + 1], w, b) for i in range(x.shape[0])])
        if shared_from is not None and x.shape[0] >= shared_from:
            return rows  # one kernel for every call from `shared_from` rows
        return rows * (1 + x.shape[0] * 1e-7)  # a kernel of its own for each row count

    monkeypatch.setattr(batch_step.F, "linear", linear)
    monkeypatch.setattr(batch_step, "_RULES", {})
    rule = call_rule(tiny.forward)
    assert rule is picked
    assert call_rule(tiny.forward) is rule and len(batch_step._RULES) == 1


def test_bad_arguments_are_refused(tiny: LoadedModel) -> None:
    seqs, tokens = batch(tiny, (3, 5))
    with pytest.raises(ValueError, match="one slot, token and position per sequence"):
        batched_dense_step(tiny.forward, seqs, torch.tensor([1, 2]), tokens[:1], [3, 5])


def test_one_step_is_the_dense_step_and_reads_any_layout_as_consecutive_pages(
    tiny: LoadedModel,
) -> None:
    """On consecutive pages `one_step` is `dense_step` bit for bit; on pages taken beside
    another sequence, or in descending order, it gives those same bits (a token-order copy),
    and so does the batched step."""
    f = tiny.forward
    ordered, token = prefilled(tiny, pool_of(tiny), 7, 40)
    reference, _ = prefilled(tiny, pool_of(tiny), 7, 40)
    keys, values = ordered.gather_all(slice(None))
    want = dense_step(f, reference, token, 40)
    got = one_step(f, ordered, token, 40)
    assert torch.equal(got, want)

    pool = pool_of(tiny)
    scattered, other = SequenceKV(pool), SequenceKV(pool)
    for start in range(0, 40, 16):  # pages alternate with another sequence's
        n = min(16, 40 - start)
        scattered.write_all(scattered.extend(n), keys[:, start : start + n],
                            values[:, start : start + n])  # fmt: skip
        other.extend(16)
    backwards = SequenceKV(pool)
    backwards.table.pages = list(reversed(pool.allocate(3)))  # pages in descending order
    backwards.write_all(backwards.extend(40), keys, values)
    for seq in (scattered, backwards):
        assert len(seq.spans()) > 1 or seq.table.pages != sorted(seq.table.pages)
        assert torch.equal(one_step(f, seq, token, 40), want)
    again, _ = prefilled(tiny, pool_of(tiny), 7, 40)
    rows = step(tiny, [again], [token])[0]
    fresh = SequenceKV(pool)
    fresh.table.pages = list(reversed(pool.allocate(3)))
    fresh.write_all(fresh.extend(40), keys, values)
    assert torch.equal(step(tiny, [fresh], [token])[0], rows)


def test_a_step_timed_by_part_gets_the_same_logits(tiny: LoadedModel) -> None:
    """`times` reads clocks and changes nothing: the same logits bit for bit; the dense rows'
    attention and the shared rest are counted, nothing for kinds absent or chunks."""
    seqs, tokens = batch(tiny, LENGTHS)
    ref_seqs, _ = batch(tiny, LENGTHS)
    times = StepTimes()
    positions = [s.num_tokens for s in seqs]
    slots = torch.cat([s.extend(1) for s in seqs])
    rows = dense_rows(tiny.forward, seqs, slots, tokens, positions)
    got, _ = batched_step(tiny.forward, rows, (), times)
    assert torch.equal(got, step(tiny, ref_seqs, tokens))
    assert set(times.attention) == {"dense"} and times.attention["dense"] > 0
    assert times.rest > 0 and times.chunks == 0.0
    again = StepTimes()
    again.add(times)
    again.add(times)
    assert again.seconds() == {"attention:dense": 2 * times.attention["dense"], "chunks": 0.0,
                               "rest": 2 * times.rest}  # fmt: skip
