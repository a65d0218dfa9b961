"""One decode step for many sequences: projections and MLPs as one batch, attention per
sequence over its own pages, read in place (`decode.dense.paged_attention`).

    rows      [seq 0][seq 1] ... [seq B-1][pad ... ]      B real rows, padded to a multiple of 4
    embed     (R, D)
    layer l   project (R, H, Dh) -> write row b's k/v at seq b's new slot
              attention row b over seq b's slot runs (its window's, on a windowed layer)
              finish (R, D): o_proj + MLP of every row at once
    logits    (B, V)

Rows are padded to a multiple of `ROW_BLOCK` because this CPU build's matmul computes a row the
same whatever rows sit beside it only then (`tests/runtime/test_batch_step.py` checks it on
the model's shapes): a sequence's logits are then the same bits in any batch of two or more,
and in a batch of itself alone (what a preempted turn's recompute replays). Padding rows
attend nothing (their attention output is zero) and their logits are dropped. The scheduler
feeds a turn that is alone in its step through the one-sequence step instead, which is faster
(a one-row matmul reads the weights once, the padded one packs them).

The reference is `decode.dense.dense_step`, one sequence at a time; the two agree to fp32
rounding (a one-row matmul sums in another order).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentcache.decode.dense import layer_spans, paged_attention
from agentcache.kv.pool import SequenceKV
from agentcache.model.llama import LlamaForward

ROW_BLOCK = 4


def padded_rows(n: int) -> int:
    return max(ROW_BLOCK, -(-n // ROW_BLOCK) * ROW_BLOCK)


def batched_dense_step(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int],
) -> Tensor:  # fmt: skip
    """Write tokens[b] at positions[b] into slots[b] of seqs[b], each sequence already extended
    by that one slot, for every b; the logits after each (B, V). For forwards where
    `decode.dense.reads_in_place` holds; the sequences share one pool."""
    f, b = forward, len(seqs)
    if not b or not slots.shape[0] == len(tokens) == len(positions) == b:
        raise ValueError(f"one slot, token and position per sequence, got {b}, "
                         f"{slots.shape[0]}, {len(tokens)}, {len(positions)}")  # fmt: skip
    rows = padded_rows(b)
    pad = rows - b
    pool = seqs[0].pool
    ids = torch.tensor([*tokens, *[0] * pad])
    pos = torch.tensor([*positions, *[0] * pad])
    hidden = f.embed(ids)
    if pad:
        hidden[b:] = 0.0
    spans = [layer_spans(f, s) for s in seqs]  # [seq][layer]
    attn = torch.zeros(rows, f.config.num_heads * f.config.head_dim, dtype=hidden.dtype)
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, pos)
        keys, values = pool.keys[layer], pool.values[layer]
        keys.index_copy_(0, slots, k[:b])
        values.index_copy_(0, slots, v[:b])
        for i in range(b):
            attn[i] = paged_attention(q[i : i + 1], keys, values, spans[i][layer], f.scale)[0]
        hidden = f.finish(layer, hidden, attn)
    return f.logits(hidden)[:b]
