"""Sparse decoders' rows in the batched step (`batch_step.batched_step`) against their own
one-sequence step (`SparseDecoder.step`), and beside dense rows and each other: the row
invariance of the dense rows holds for theirs."""

from __future__ import annotations

import dataclasses

import torch

from agentcache.decode.base import StepRow
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.policies import FlexiCache, HeadPlan, MultiScale, Quest, Streaming
from agentcache.decode.stats import DecodeStats
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.runtime.batch_step import DenseRow, batched_step, one_step
from tests.decode.conftest import make_profile
from tests.runtime.test_batch_step import pool_of, prefilled

STEPS = 24  # a few reranks of every interval below, pages opened, windows slid
PROMPTS = {"quest": 100, "quest-interval": 113, "flexicache": 131, "multiscale": 77,
           "streaming": 150}  # fmt: skip


def plan(model: LoadedModel, name: str) -> HeadPlan:
    c = model.config
    policy = {
        "quest": Quest(),
        "quest-interval": Quest(interval=4),  # every head offloaded
        "flexicache": FlexiCache(stable_interval=4),
        "multiscale": MultiScale(),
        "streaming": Streaming(window=2, stable_interval=4),
    }
    return policy[name].plan(c.num_layers, c.num_kv_heads, make_profile(model))  # fmt: skip


def sparse(model: LoadedModel, name: str) -> SparseDecoder:
    """`name`'s decoder over a prompt's K/V (random, seeded by its length), room for STEPS."""
    c, n = model.config, PROMPTS[name]
    g = torch.Generator().manual_seed(n)
    keys, values = torch.randn(2, c.num_layers, n, c.num_kv_heads, c.head_dim, generator=g)
    config = DecodeConfig(name.split("-")[0], budget_pages=2)
    return SparseDecoder(model.forward, plan(model, name), config, keys, values, n + STEPS)


def tokens(seed: int) -> list[int]:
    return torch.randint(0, 256, (STEPS,), generator=torch.Generator().manual_seed(seed)).tolist()


def untimed(stats: DecodeStats) -> DecodeStats:
    return dataclasses.replace(stats, rerank_s=0.0)


def begun(d: SparseDecoder, token: int, position: int) -> StepRow:
    row = d.begin_step(d.f, token, position, 0)
    assert row is not None
    return row


def dense_row(model: LoadedModel, seq: SequenceKV, token: int) -> DenseRow:
    position = seq.num_tokens
    return DenseRow(model.forward, seq, seq.extend(1), token, position)


def test_sparse_rows_beside_dense_ones_agree_with_their_one_sequence_steps(
    tiny: LoadedModel,
) -> None:
    """Step by step, every policy's row and two dense rows in one batch: the logits of each
    agree with its own one-sequence step to fp32 rounding, the pages each head attends and the
    decode stats are the same."""
    names = list(PROMPTS)
    batched = [sparse(tiny, n) for n in names]
    alone = [sparse(tiny, n) for n in names]
    pool = pool_of(tiny)
    dense = [prefilled(tiny, pool, n, n)[0] for n in (40, 9)]
    ref_pool = pool_of(tiny)
    ref_dense = [prefilled(tiny, ref_pool, n, n)[0] for n in (40, 9)]
    feeds = [tokens(i) for i in range(len(names) + 2)]  # [sparse rows..., dense 0, dense 1]
    for step in range(STEPS):
        *fed, first, last = [f[step] for f in feeds]
        position = [PROMPTS[n] + step for n in names]
        rows: list[StepRow] = [dense_row(tiny, dense[0], first)]
        rows += [begun(d, t, p) for d, t, p in zip(batched, fed, position, strict=True)]
        rows.append(dense_row(tiny, dense[1], last))
        logits, _ = batched_step(tiny.forward, rows)
        want = [one_step(tiny.forward, ref_dense[0], first, ref_dense[0].num_tokens)]
        want += [d.step(t, p) for d, t, p in zip(alone, fed, position, strict=True)]
        want.append(one_step(tiny.forward, ref_dense[1], last, ref_dense[1].num_tokens))
        for got, ref in zip(logits, want, strict=True):  # fp32 rounding (a one-row product
            torch.testing.assert_close(got, ref, rtol=0, atol=5e-5)  # sums in another order)
    for b, a in zip(batched, alone, strict=True):
        assert untimed(b.stats()) == untimed(a.stats())
        for layer in range(tiny.config.num_layers):
            assert torch.equal(b.pages(layer), a.pages(layer))
    stats = alone[names.index("flexicache")].stats()
    assert stats.head_reranks > 0 and stats.pages_promoted > 0  # offloaded heads reranked
    assert alone[names.index("streaming")].stats().streaming_heads > 0
    every = alone[names.index("quest-interval")]
    assert bool(every.kv.offload.all()) and every.stats().pages_promoted > 0


def test_a_sparse_row_gets_the_same_bits_in_any_batch(tiny: LoadedModel) -> None:
    """In a padded batch of itself alone, beside a dense row, or beside other policies' rows:
    a sparse row's logits are the same bits, so its greedy tokens and stats do not depend on
    what decodes beside it."""
    runs: list[list[torch.Tensor]] = []
    stats: list[DecodeStats] = []
    for company in ([], ["dense"], ["quest", "dense", "streaming"]):
        own = sparse(tiny, "flexicache")
        policies = [n for n in company if n != "dense"]
        others = [sparse(tiny, n) for n in policies]
        pool = pool_of(tiny)
        seq = prefilled(tiny, pool, 33, 33)[0] if "dense" in company else None
        got = []
        for step, token in enumerate(tokens(0)):
            rows = [begun(d, 7, PROMPTS[n] + step) for d, n in zip(others, policies, strict=True)]
            if seq is not None:
                rows.insert(0, dense_row(tiny, seq, 11))
            mine = begun(own, token, PROMPTS["flexicache"] + step)
            logits, _ = batched_step(tiny.forward, [*rows, mine])
            got.append(logits[-1])
        runs.append(got)
        stats.append(untimed(own.stats()))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0], strict=True))
    assert stats[1] == stats[0] and stats[2] == stats[0]


def test_a_decoder_only_begins_a_step_with_its_own_forward(tiny: LoadedModel) -> None:
    from agentcache.testing import tiny_model

    d = sparse(tiny, "quest")
    assert d.begin_step(tiny_model(seed=1).forward, 3, PROMPTS["quest"], 0) is None
    assert d.kv.num_tokens == PROMPTS["quest"]  # nothing begun


def test_a_dense_pass_row_agrees_with_verify_and_gets_the_same_bits_in_any_batch(
    tiny: LoadedModel,
) -> None:
    """A verified decoder's dense pass as a row of several tokens (`begin_verify`), in a
    batched step beside a dense row and a sparse one, agrees with `verify` (the pass alone) to
    fp32 rounding and leaves the same K/V; alone in a padded batch it gets the same bits as
    beside them; the rows beside it get what they get without it."""
    fed = tokens(3)[:5]
    n = PROMPTS["flexicache"]

    def drafted() -> SparseDecoder:
        d = sparse(tiny, "flexicache")
        for i, t in enumerate(fed):
            d.step(t, n + i)
        return d

    reference = drafted()
    want = reference.verify(fed, n, n)
    alone_d, beside_d = drafted(), drafted()
    alone, _ = batched_step(tiny.forward, [alone_d.begin_verify(fed, n, n)])
    pool = pool_of(tiny)
    seq = prefilled(tiny, pool, 33, 33)[0]
    other = sparse(tiny, "quest")
    rows = [dense_row(tiny, seq, 11), beside_d.begin_verify(fed, n, n),
            begun(other, 7, PROMPTS["quest"])]  # fmt: skip
    beside, _ = batched_step(tiny.forward, rows)
    assert alone.shape == beside[1:6].shape == want.shape == (len(fed), tiny.config.vocab_size)
    assert torch.equal(beside[1:6], alone)
    torch.testing.assert_close(alone, want, rtol=0, atol=1e-5)
    ref_seq = prefilled(tiny, pool_of(tiny), 33, 33)[0]
    dense_alone = one_step(tiny.forward, ref_seq, 11, 33)
    torch.testing.assert_close(beside[0], dense_alone, rtol=0, atol=1e-5)
    quest_alone = sparse(tiny, "quest").step(7, PROMPTS["quest"])
    torch.testing.assert_close(beside[6], quest_alone, rtol=0, atol=1e-5)
    for d in (alone_d, beside_d):
        assert d.stats().verify_passes == reference.stats().verify_passes == 1
        for layer in range(tiny.config.num_layers):
            for h in range(tiny.config.num_kv_heads):
                got, ref = d.kv.full_kv(layer, h), reference.kv.full_kv(layer, h)
                torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
