"""Dense decode over the page pool, read in place: the engine's decode step.

A decode query attends every token of its sequence, in any order (softmax over a set), so the
context needs no token-order copy. The sequence's slots form a few runs of consecutive pool
slots (`SequenceKV.spans`); each run is a view of the pool layer (stored head-major: each KV
head's part of a run is one contiguous block), attended with SDPA's CPU flash kernel, and the
runs' partial results are merged by their log-sum-exp:

    pool layer (N, Hkv, Dh)   [...... run 0 ......][.. other sequences ..][.. run 1 ..]
    view per run              (1, Hkv, n_r, Dh), no copy
    out = sum_r softmax_r(lse_r) * out_r

One run (a sequence on consecutive pages) is the usual case; pages handed out in descending
order make two runs until the newest page fills. A sliding-window layer (W) reads only the runs
of the sequence's last W tokens:

    tokens   [0 ........ n-W-1][n-W ............ n-1]
    slots    not read          runs of these slots (`window_spans`)

`dense_step` is one decode step over a `ReadPlan`, the seam that says what each layer's query
reads and how it attends it: `InPlaceRuns` (the runs above, the engine's default) here, the
batched scheduler's token-order reads in `runtime/batch_step.py`. It is a `PlanRow` (the
sequence's row: write each layer's K/V, attend the plan's reads) run alone by
`decode.base.row_step`; the batched step runs the same row beside others. `DenseDecoder` is
the engine's dense decoder over its page pool.

`reference_step` is the reference path: it gathers the context into a token-order copy
(`SequenceKV.gather`) and calls the forward's own `attend`. Forwards whose attention depends
on token order or adds terms (`attend` overridden, e.g. CoPE) decode through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from agentcache.decode.base import Decoder, StepRow, row_step
from agentcache.kv.pool import SequenceKV, slot_runs
from agentcache.model.llama import LlamaForward

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, lse)


def paged_attention(
    q: Tensor, keys: Tensor, values: Tensor, spans: list[tuple[int, int]], scale: float
) -> Tensor:
    """One token's attention over pool slots `spans` of one layer, without copying them.

    q (1, H, Dh); keys/values (N, Hkv, Dh), a pool layer; spans [(start, end)] -> (1, H*Dh)."""
    hkv, dh = keys.shape[1], keys.shape[2]
    qg = q.reshape(1, hkv, -1, dh)  # (1, Hkv, G, Dh): a group's query heads as G queries
    outs, lses = [], []
    for start, end in spans:
        k = keys[start:end].transpose(0, 1).unsqueeze(0)  # (1, Hkv, n, Dh) view
        v = values[start:end].transpose(0, 1).unsqueeze(0)
        out, lse = _flash(qg, k, v, 0.0, False, attn_mask=None, scale=scale)
        outs.append(out)  # (1, Hkv, G, Dh)
        lses.append(lse)  # (1, Hkv, G)
    if len(outs) == 1:
        return outs[0].reshape(1, -1)
    weights = torch.softmax(torch.stack(lses), dim=0).unsqueeze(-1)  # (R, 1, Hkv, G, 1)
    return (torch.stack(outs) * weights).sum(0).reshape(1, -1)


def reads_in_place(forward: LlamaForward) -> bool:
    """Whether `forward`'s attention is plain softmax attention, which `paged_attention` is."""
    return type(forward).attend is LlamaForward.attend


def window_spans(seq: SequenceKV, window: int) -> list[tuple[int, int]]:
    """Runs [start, end) of consecutive pool slots holding the sequence's last `window` tokens."""
    return slot_runs(seq.slots()[-window:])


def layer_spans(forward: LlamaForward, seq: SequenceKV) -> list[list[tuple[int, int]]]:
    """The slot runs each layer's decode query reads: all of `seq`, or its window's."""
    spans = seq.spans()
    windows = [la.window for la in forward.spec.layers]
    if not forward.spec.windowed:
        return [spans] * len(windows)
    n = seq.num_tokens
    runs = {w: window_spans(seq, w) for w in set(windows) if w is not None and w < n}
    return [spans if w is None else runs.get(w, spans) for w in windows]


R = TypeVar("R")  # what one layer's query reads


class ReadPlan(ABC, Generic[R]):
    """How a decode query reads its sequence's context in the pool: the mechanism of a dense
    step (`dense_step`) apart from this policy.

    Contract: `reads` is called once per step, after the new token's slot is taken and before
    any layer's K/V is written, and returns one read per layer of `forward` (what that layer's
    query sees: every token of `seq`, or its window's). `attend` returns one query's attention
    output (1, H*Dh), a new tensor owned by the caller, over `read` of a pool layer
    `keys`/`values` (N, Hkv, Dh); it reads nothing but the slots of its read and writes
    nothing. Only for forwards where `reads_in_place` holds."""

    @abstractmethod
    def reads(self, forward: LlamaForward, seq: SequenceKV) -> list[R]:
        """One read per layer of `seq`'s context."""

    @abstractmethod
    def attend(self, q: Tensor, keys: Tensor, values: Tensor, read: R, scale: float) -> Tensor:
        """q (1, H, Dh) over `read` -> (1, H*Dh)."""


class InPlaceRuns(ReadPlan[list[tuple[int, int]]]):
    """Each layer's slot runs (`layer_spans`), read in place and merged by log-sum-exp."""

    def reads(self, forward: LlamaForward, seq: SequenceKV) -> list[list[tuple[int, int]]]:
        return layer_spans(forward, seq)

    def attend(
        self, q: Tensor, keys: Tensor, values: Tensor, read: list[tuple[int, int]], scale: float
    ) -> Tensor:
        return paged_attention(q, keys, values, read, scale)


IN_PLACE = InPlaceRuns()


class PlanRow(StepRow):
    """A dense sequence's row of a step: `seq` already extended by `slot` (1,) for `token`;
    each layer writes k/v there and attends what `plan` reads of `seq` (its reads taken when
    the row is made: after the slot, before any K/V of the step is written)."""

    def __init__(
        self, forward: LlamaForward, seq: SequenceKV, slot: Tensor, token: int, position: int,
        plan: ReadPlan[Any],
    ) -> None:  # fmt: skip
        super().__init__(token, position)
        self.seq, self.slot, self.plan, self.scale = seq, slot, plan, forward.scale
        self.reads = plan.reads(forward, seq)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.seq.write(layer, self.slot, k, v)
        pool = self.seq.pool
        read = self.reads[layer]
        return self.plan.attend(q, pool.keys[layer], pool.values[layer], read, self.scale)

    def end(self) -> None:
        """Nothing: the sequence's slot was taken before the step."""


def dense_step(
    forward: LlamaForward, seq: SequenceKV, token: int, position: int,
    plan: ReadPlan[Any] = IN_PLACE,
) -> Tensor:  # fmt: skip
    """Append `token` at `position` to `seq` and return the logits after it (V,), each layer's
    context read as `plan` says (default: in place): a `PlanRow` run alone (`row_step`). Only
    for forwards where `reads_in_place` holds."""
    return row_step(forward, PlanRow(forward, seq, seq.extend(1), token, position, plan))


def reference_step(forward: LlamaForward, seq: SequenceKV, token: int, position: int) -> Tensor:
    """`dense_step` through a token-order copy of the context and the forward's `attend`."""
    f = forward
    slot = seq.extend(1)
    pos = torch.tensor([position])
    hidden = f.embed(torch.tensor([token]))
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, pos)
        seq.write(layer, slot, k, v)
        keys, values = seq.gather(layer)
        hidden = f.attend(layer, hidden, q, keys, values, None)
    return f.logits(hidden)[0]


class DenseDecoder(Decoder):
    """Dense decode of `seq` in the page pool through `step` (the engine's: `dense_step`, or
    `reference_step` for forwards that need it); holds no more tokens once `seq` holds
    `capacity` (the pool's)."""

    def __init__(
        self, step: Callable[[SequenceKV, int, int], Tensor], seq: SequenceKV, capacity: int
    ) -> None:
        self.step, self.seq, self.capacity = step, seq, capacity

    def feed(self, token: int, position: int, room: int) -> Tensor | None:
        if self.seq.num_tokens >= self.capacity:
            return None
        return self.step(self.seq, token, position)
