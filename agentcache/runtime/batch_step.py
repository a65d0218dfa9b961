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

Layout: attention sums over keys in the order it reads them, so its bits depend on where a
sequence's pages lie. Both steps here read a layer's context in place when its slots are one
run in token order (pages in ascending order, as a sequence admitted with all its pages gets
them) and otherwise from a token-order copy (`layer_reads`): a sequence whose pages were taken
as it went, beside others, or given back and taken again (preemption), gets the bits it gets
on consecutive pages. That rule is a read plan (`TokenOrderReads`, `decode.dense.ReadPlan`);
`one_step` is `dense_step` over it: the same bits on a sequence in token order, tested.

`fused_step` is the batched step with prefill chunks' rows beside the decode rows (the
scheduler's chunked prefill, `runtime/chunked.py`): each part of the rows starts on and is
padded to a multiple of `ROW_BLOCK`, so the decode rows keep the bits they get without the
chunks, and a chunk gets the bits it gets with nothing beside it; attention stays per sequence.
Its reference for the chunks is `reuse.base.compute_subset` (to fp32 rounding, tested).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.decode.base import StepRow
from agentcache.decode.dense import PlanRow, ReadPlan, dense_step, paged_attention
from agentcache.kv.pool import SequenceKV
from agentcache.model.attention import attention
from agentcache.model.llama import LlamaForward
from agentcache.reuse.base import context_reader

ROW_BLOCK = 4


def padded_rows(n: int) -> int:
    return max(ROW_BLOCK, -(-n // ROW_BLOCK) * ROW_BLOCK)


Read = tuple[int, int] | Tensor  # a run [start, end) of slots in token order, or slots to copy


def layer_reads(forward: LlamaForward, seq: SequenceKV) -> list[Read]:
    """What each layer's decode query reads of `seq`: its slots (all, or a sliding window's
    last W) as one run when they are consecutive in token order, else the slots in token order."""
    slots = seq.slots()
    pages = seq.table.pages
    ordered = all(b - a == 1 for a, b in itertools.pairwise(pages))
    whole: Read = (int(slots[0]), int(slots[-1]) + 1) if ordered and len(slots) else slots
    n = seq.num_tokens
    reads: list[Read] = []
    windows: dict[int, Read] = {}
    for la in forward.spec.layers:
        w = la.window
        if w is None or w >= n:
            reads.append(whole)
            continue
        if w not in windows:
            part = slots[-w:]
            run = bool(torch.all(torch.diff(part) == 1))
            windows[w] = (int(part[0]), int(part[-1]) + 1) if run else part
        reads.append(windows[w])
    return reads


def attend(q: Tensor, keys: Tensor, values: Tensor, read: Read, scale: float) -> Tensor:
    """One row's attention (1, H*Dh) over `read` of a pool layer `keys`/`values` (N, Hkv, Dh):
    in place for a run, else over a token-order copy laid out as a run is (head-major)."""
    if isinstance(read, tuple):
        return paged_attention(q, keys, values, [read], scale)
    n = read.shape[0]
    k = keys[read].transpose(0, 1).contiguous().transpose(0, 1)  # (n, Hkv, Dh), head-major
    v = values[read].transpose(0, 1).contiguous().transpose(0, 1)
    return paged_attention(q, k, v, [(0, n)], scale)


class TokenOrderReads(ReadPlan[Read]):
    """Each layer's context as one run when its slots are consecutive in token order, else a
    token-order copy (`layer_reads`, `attend`): the same bits in any page layout."""

    def reads(self, forward: LlamaForward, seq: SequenceKV) -> list[Read]:
        return layer_reads(forward, seq)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, read: Read, scale: float) -> Tensor:
        return attend(q, keys, values, read, scale)


TOKEN_ORDER = TokenOrderReads()


def one_step(forward: LlamaForward, seq: SequenceKV, token: int, position: int) -> Tensor:
    """`decode.dense.dense_step` over `TokenOrderReads`: alone, the scheduler's step."""
    return dense_step(forward, seq, token, position, TOKEN_ORDER)


class DenseRow(PlanRow):
    """A dense sequence's row in a batched step: `seq` already extended by `slot` (1,) for
    `token`, read at `TOKEN_ORDER` (the row `one_step` runs alone)."""

    def __init__(
        self, forward: LlamaForward, seq: SequenceKV, slot: Tensor, token: int, position: int
    ) -> None:
        super().__init__(forward, seq, slot, token, position, TOKEN_ORDER)


def dense_rows(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int],
) -> list[StepRow]:  # fmt: skip
    """One `DenseRow` per sequence: slots[b] (taken), tokens[b], positions[b] of seqs[b]."""
    b = len(seqs)
    if not slots.shape[0] == len(tokens) == len(positions) == b:
        raise ValueError(f"one slot, token and position per sequence, got {b}, "
                         f"{slots.shape[0]}, {len(tokens)}, {len(positions)}")  # fmt: skip
    return [DenseRow(forward, s, slots[i : i + 1], tokens[i], positions[i])
            for i, s in enumerate(seqs)]  # fmt: skip


def batched_dense_step(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int],
) -> Tensor:  # fmt: skip
    """Write tokens[b] at positions[b] into slots[b] of seqs[b], each sequence already extended
    by that one slot, for every b; the logits after each (B, V). For forwards where
    `decode.dense.reads_in_place` holds; the sequences share one pool."""
    if not seqs:
        raise ValueError("one slot, token and position per sequence, got 0 sequences")
    return fused_step(forward, seqs, slots, tokens, positions, ())[0]


@dataclass(frozen=True)
class ChunkRows:
    """A prefill chunk's rows in a fused step: tokens `ids` (n,) of `seq` at their indices
    `index` (n,) in it, sorted, which are also their positions; each row writes its K/V at its
    token's slot and attends causally over `seq`'s tokens 0..its index (loaded, written by
    earlier chunks, or by the rows before it), as `reuse.base.compute_subset` computes them."""

    seq: SequenceKV
    ids: Tensor
    index: Tensor


def fused_step(
    forward: LlamaForward, seqs: Sequence[SequenceKV], slots: Tensor, tokens: Sequence[int],
    positions: Sequence[int], chunks: Sequence[ChunkRows],
) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """`batched_step` of dense decode rows (`dense_rows`, B may be 0) and prefill chunks."""
    return batched_step(forward, dense_rows(forward, seqs, slots, tokens, positions), chunks)


def batched_step(
    forward: LlamaForward, rows: Sequence[StepRow], chunks: Sequence[ChunkRows] = ()
) -> tuple[Tensor, list[Tensor]]:
    """One decode step of `rows` (B may be 0; dense rows `DenseRow`, a sparse decoder's its
    `begin_step` row) with prefill chunks' rows beside them in the same projections and MLPs:
    the decode logits (B, V) and each chunk's logits after its last token (V,). Each chunk is
    of its own sequence, not one of the rows'. Every row is run to its `end`.

        rows   [decode 0..B-1][pad][chunk 0][pad][chunk 1][pad]    each part a multiple of 4

    Each part starts at a multiple of `ROW_BLOCK` and is padded to one, so the decode rows get
    the bits they get without the chunks, and a chunk's rows do not depend on what sits beside
    them (the row invariance the batched step rests on). Attention stays per sequence: a
    decode row's is its own (`StepRow.attend`: a dense row over its sequence's reads, a sparse
    row over the pages its decoder selects), a chunk's rows over its sequence's K/V in token
    order under the causal mask (`model.attention.attention` with the rows' indices, the
    forward's own attention: the same bits as the chunk run on its own, given the same q, k,
    v)."""
    f, b = forward, len(rows)
    if not b and not chunks:
        raise ValueError("a fused step needs a decode row or a chunk")
    starts, width = [], padded_rows(b) if b else 0
    ids = [*(r.token for r in rows), *[0] * (width - b)]
    pos = [*(r.position for r in rows), *[0] * (width - b)]
    for c in chunks:
        n = len(c.ids)
        if not n or len(c.index) != n:
            raise ValueError(f"a chunk needs one index per token, got {n} and {len(c.index)}")
        starts.append(width)
        pad = padded_rows(n) - n
        ids += [*c.ids.tolist(), *[0] * pad]
        pos += [*c.index.tolist(), *[0] * pad]
        width += n + pad
    hidden = f.embed(torch.tensor(ids))
    real = torch.zeros(width, dtype=torch.bool)
    real[:b] = True
    for c, s in zip(chunks, starts, strict=True):
        real[s : s + len(c.ids)] = True
    hidden[~real] = 0.0  # padding rows: zero in, attention zero, logits dropped
    position = torch.tensor(pos)
    chunk_slots = [c.seq.slots()[c.index] for c in chunks]
    contexts = [context_reader(c.seq) for c in chunks]
    attn = torch.zeros(width, f.config.num_heads * f.config.head_dim, dtype=hidden.dtype)
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, position)
        for c, s, cs in zip(chunks, starts, chunk_slots, strict=True):
            c.seq.write(layer, cs, k[s : s + len(c.ids)], v[s : s + len(c.ids)])
        for i, r in enumerate(rows):
            attn[i] = r.attend(layer, q[i : i + 1], k[i : i + 1], v[i : i + 1])[0]
        window = f.spec.layers[layer].window
        for c, s, context in zip(chunks, starts, contexts, strict=True):
            kc, vc = context(layer)
            e = s + len(c.ids)
            attn[s:e] = attention(q[s:e], kc, vc, c.index, f.scale, window)
        hidden = f.finish(layer, hidden, attn)
    for r in rows:
        r.end()
    vocab = f.weights.lm_head.shape[0]
    decode = f.logits(hidden[: padded_rows(b)])[:b] if b else hidden.new_zeros(0, vocab)
    last = [f.logits(hidden[s + len(c.ids) - 1 : s + len(c.ids)])[0] for c, s in
            zip(chunks, starts, strict=True)]  # fmt: skip
    return decode, last
