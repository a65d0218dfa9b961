"""The batched decode step against the one-sequence step (`decode.dense.dense_step`), and the
row invariance it rests on: a sequence's logits are the same bits in any batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agentcache.decode.dense import dense_step
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.runtime.batch_step import ROW_BLOCK, batched_dense_step, one_step, padded_rows
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
    """Bit for bit: its greedy output does not depend on what else decodes beside it."""
    alone = []
    for n in LENGTHS:
        seqs, tokens = batch(tiny, (n,))
        alone.append(step(tiny, seqs, tokens)[0])
    for size in (2, 3, 5):
        seqs, tokens = batch(tiny, LENGTHS[:size])
        got = step(tiny, seqs, tokens)
        for i in range(size):
            assert torch.equal(got[i], alone[i])


@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 576)])
def test_matmul_rows_do_not_depend_on_the_rows_beside_them_in_blocks_of_four(
    shape: tuple[int, int],
) -> None:
    """What the padding rests on, at the default model's projection shapes: with the row count
    a multiple of ROW_BLOCK, each row of x @ W.T is the same bits whatever the other rows."""
    torch.manual_seed(0)
    w = torch.randn(shape)
    x = torch.randn(32, shape[1])
    full = F.linear(x, w)
    for rows in range(ROW_BLOCK, 33, ROW_BLOCK):
        assert torch.equal(F.linear(x[:rows], w), full[:rows])
        assert torch.equal(F.linear(x[32 - rows :], w), full[32 - rows :])


def test_rows_are_padded_to_a_multiple_of_the_block() -> None:
    assert [padded_rows(n) for n in (1, 3, 4, 5, 16, 17)] == [4, 4, 4, 8, 16, 20]


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
