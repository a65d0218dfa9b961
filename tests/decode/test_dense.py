"""Dense decode read in place (`decode.dense`) against the gathered reference and the forward."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from agentcache.decode.dense import dense_step, paged_attention, reads_in_place, reference_step
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.llama import LlamaForward, attention
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig

ATOL = 1e-5  # fp32 rounding: the flash kernel and the run merge sum in another order


def _fragmented(pool: PagePool, lengths: list[int]) -> SequenceKV:
    """A sequence whose pages interleave with another's, so its slots form several runs."""
    seq, other = SequenceKV(pool), SequenceKV(pool)
    for n in lengths:
        seq.extend(n)
        other.extend(pool.config.page_size)
    return seq


@pytest.mark.parametrize(("heads", "kv_heads", "lengths"), [(4, 2, [37]), (9, 3, [5, 20, 3, 33]),
                                                             (6, 6, [16, 1, 16])])  # fmt: skip
def test_paged_attention_equals_attention_over_the_gathered_context(
    heads: int, kv_heads: int, lengths: list[int]
) -> None:
    g = torch.Generator().manual_seed(heads)
    pool = PagePool(PoolConfig(1, kv_heads, 8, num_pages=32, page_size=4))
    pool.keys.copy_(torch.randn(pool.keys.shape, generator=g))
    pool.values.copy_(torch.randn(pool.values.shape, generator=g))
    seq = _fragmented(pool, lengths)
    assert len(seq.spans()) > 1 or len(lengths) == 1
    q = torch.randn(1, heads, 8, generator=g)
    keys, values = seq.gather(0)
    want = attention(q, keys, values, None, 8**-0.5)
    got = paged_attention(q, pool.keys[0], pool.values[0], seq.spans(), 8**-0.5)
    assert got.shape == want.shape and float((got - want).abs().max()) <= ATOL


Step = Callable[[LlamaForward, SequenceKV, int, int], Tensor]


def _decode(model: LoadedModel, step: Step, fragmented: bool, ids: list[int]) -> list[Tensor]:
    """Logits after each of `ids` past the first 40 (prefilled by the forward), step by step."""
    c = model.config
    pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 64, page_size=4))
    seq = _fragmented(pool, [3, 9, 28] if fragmented else [40])
    out = model.forward.forward(torch.tensor(ids[:40]))
    seq.write_all(seq.slots(), out.keys, out.values)
    assert (len(seq.spans()) > 1) == fragmented
    with torch.inference_mode():
        return [step(model.forward, seq, tok, 40 + i) for i, tok in enumerate(ids[40:])]


@pytest.mark.parametrize("fragmented", [False, True])
def test_dense_step_matches_the_reference_forward_over_many_steps(
    tiny: LoadedModel, fragmented: bool
) -> None:
    ids = torch.randint(0, 256, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = tiny.forward.forward(torch.tensor(ids)).logits
    fast = _decode(tiny, dense_step, fragmented, ids)
    gathered = _decode(tiny, reference_step, fragmented, ids)
    assert len(fast) == 80
    for i, (a, b) in enumerate(zip(fast, gathered, strict=True)):
        assert float((a - ref[40 + i]).abs().max()) <= ATOL, f"step {i}"
        assert float((a - b).abs().max()) <= ATOL, f"step {i}"


class _OwnAttention(LlamaForward):
    def attend(self, layer: int, hidden: Tensor, q: Tensor, keys: Tensor, values: Tensor,
               query_index: Tensor | None) -> Tensor:  # fmt: skip
        return super().attend(layer, hidden, q, keys, values, query_index)


def test_a_forward_with_its_own_attention_decodes_through_the_counted_gather(
    tiny: LoadedModel,
) -> None:
    f = tiny.forward
    own = dataclasses.replace(tiny, forward=_OwnAttention(f.config, f.weights, f.rope))
    assert reads_in_place(f) and not reads_in_place(own.forward)
    logits = {}
    for name, model in (("plain", tiny), ("own", own)):
        engine = Engine(model, EngineConfig(strategy="full", kv_pages=16))
        seq = SequenceKV(engine.ctx.pool)
        out = f.forward(torch.tensor([5, 6, 7]))
        seq.write_all(seq.extend(3), out.keys, out.values)
        logits[name] = [engine.step(seq, t, 3 + i) for i, t in enumerate([8, 9])]
        assert engine.gathered_steps == (2 if name == "own" else 0)
    for a, b in zip(logits["plain"], logits["own"], strict=True):
        assert float((a - b).abs().max()) <= ATOL
