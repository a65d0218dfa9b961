"""Causal attention for queries that form a few contiguous runs of the context, at the cost of
plain causal attention: the fast path of `attention.attention` when not every token is computed.

A masked SDPA over (T, S) computes every query against every key, masked or not: a prefill
that computes the last T of S tokens does T * S work where causal attention does about
T * S - T^2 / 2, and on CPU it cannot use the causal kernel. Instead each run of consecutive
query indices [a, b) takes one of two ways (`QueryRun`):

    padded   : one causal call over keys [0, b), query rows [0, a) placeholders (zeros), their
               outputs dropped: a^2 / 2 pairs more than the run needs, no second call, no merge
    split    : two parts, merged by their log-sum-exp
      keys   : [0 ........ a)[a ..... b)  (keys after b are masked for every query of the run)
      part 1 :  every query of the run sees all of them (no mask)
      part 2 :                each query sees the run's keys up to itself (square, causal)
      out    = part 2 + sigmoid(lse1 - lse2) * (part 1 - part 2)

A run pads when its placeholder pairs cost less than the split's second call and merge
(`PAD_PAIRS_PER_ROW` pairs per query row of the run): a run behind a short reused prefix costs
what `full`'s causal call costs, a short run behind a long one its own pairs only.

Both are exact up to rounding. The kernel that returns the log-sum-exp is PyTorch's CPU flash
attention (grouped-query heads natively); elsewhere (other devices), or for scattered query
sets (many runs), `blocked_attention` splits the query rows into `BLOCKS` blocks, each attending
with a mask over the keys up to its last query only (about half the pairs of one masked call).
`tests/model/test_run_attention.py` checks both against `masked_attention`, the reference.
`attention_pairs` counts the (query, key) pairs the path a query set takes computes (the cost
guard, reuse/guard.py, reads it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# scattered query sets (a ranking's picks) make many short runs: two kernel calls per run
# would cost more than one masked call
MAX_RUNS = 8
BLOCKS = 8
# what the split's second call and merge cost per query row, in (query, key) pairs: a run
# of R rows behind a keys pads when a^2 / 2 <= PAD_PAIRS_PER_ROW * R (measured both ways in
# docs/bench/long-prompts/attention, benchmarks/reuse/run_attention_cost.py)
PAD_PAIRS_PER_ROW = 64
_FLASH: Callable[..., tuple[Tensor, Tensor]] | None = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None
)


@dataclass(frozen=True)
class QueryRun:
    """Query rows [r0, r1) at context indices [a, b), consecutive."""

    r0: int
    r1: int
    a: int
    b: int

    @property
    def padded(self) -> bool:
        """One causal call over [0, b) with placeholder rows for [0, a), not a split."""
        return self.a * self.a / 2 <= PAD_PAIRS_PER_ROW * (self.r1 - self.r0)

    @property
    def pairs(self) -> float:
        """(query, key) pairs its attention computes."""
        if self.padded:
            return self.b * (self.b + 1) / 2
        n = self.r1 - self.r0
        return n * self.a + n * (n + 1) / 2


def query_runs(query_index: Tensor) -> list[tuple[int, int]]:
    """(start, end) rows of `query_index` (T,), strictly increasing, where it steps by one."""
    breaks = (query_index.diff() != 1).nonzero().flatten().add(1).tolist()
    edges = [0, *breaks, len(query_index)]
    return list(itertools.pairwise(edges))


def runs_of(query_index: Tensor) -> list[QueryRun]:
    """Every run of `query_index` (T,), strictly increasing, with its context span."""
    idx = query_index.tolist()
    return [QueryRun(r0, r1, idx[r0], idx[r1 - 1] + 1) for r0, r1 in query_runs(query_index)]


def runs_attention(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor, scale: float
) -> Tensor | None:
    """q (T, H, Dh) at context indices `query_index` (T,, strictly increasing), keys/values
    (S, Hkv, Dh) -> (T, H*Dh); None when this path does not apply (not CPU, too many runs)."""
    if _FLASH is None or not uses_runs(q, query_index):
        return None
    t, h, dh = q.shape
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
    kh = keys.transpose(0, 1).unsqueeze(0)  # (1, Hkv, S, Dh): the kernel groups heads itself
    vh = values.transpose(0, 1).unsqueeze(0)
    out = q.new_empty(t, h, dh).transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh) over (T, H, Dh)
    for r in runs_of(query_index):
        qr, rows = qh[:, :, r.r0 : r.r1], out[:, :, r.r0 : r.r1]
        if r.padded:
            rows.copy_(_padded(qr, kh, vh, r, scale))
            continue
        o2, lse2 = _FLASH(qr, kh[:, :, r.a : r.b], vh[:, :, r.a : r.b], 0.0, True, scale=scale)
        o1, lse1 = _FLASH(qr, kh[:, :, : r.a], vh[:, :, : r.a], 0.0, False, scale=scale)
        w1 = torch.sigmoid(lse1 - lse2).unsqueeze(-1)  # (1, H, R, 1): part 1's share
        torch.lerp(o2, o1, w1, out=rows)
    return out[0].transpose(0, 1).reshape(t, -1)


def _padded(qr: Tensor, kh: Tensor, vh: Tensor, r: QueryRun, scale: float) -> Tensor:
    """The run's rows of one causal call over keys [0, b). qr (1, H, R, Dh) -> (1, H, R, Dh)"""
    assert _FLASH is not None
    if r.a == 0:
        return _FLASH(qr, kh[:, :, : r.b], vh[:, :, : r.b], 0.0, True, scale=scale)[0]
    qp = qr.new_zeros(1, qr.shape[1], r.b, qr.shape[3])  # rows [0, a): placeholders
    qp[:, :, r.a :] = qr
    return _FLASH(qp, kh[:, :, : r.b], vh[:, :, : r.b], 0.0, True, scale=scale)[0][:, :, r.a :]


def uses_runs(q: Tensor, query_index: Tensor) -> bool:
    return (
        _FLASH is not None
        and q.device.type == "cpu"
        and len(query_index) >= 2
        and len(query_runs(query_index)) <= MAX_RUNS
    )


def blocked_attention(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor, scale: float
) -> Tensor:
    """`masked_attention` in up to `BLOCKS` blocks of query rows, each over the keys up to its
    last query. q (T, H, Dh), keys/values (S, Hkv, Dh) -> (T, H*Dh)."""
    t = q.shape[0]
    bounds = _block_bounds(t)
    parts = []
    for r0, r1 in itertools.pairwise(bounds):
        end = int(query_index[r1 - 1]) + 1
        rows = slice(r0, r1)
        parts.append(masked_attention(q[rows], keys[:end], values[:end], query_index[rows], scale))
    return torch.cat(parts)


def masked_attention(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor, scale: float
) -> Tensor:
    """The reference: one SDPA call with a (T, S) mask. -> (T, H*Dh)"""
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, keys, values))
    mask = torch.arange(keys.shape[0])[None, :] <= query_index[:, None]  # (T, S)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def attention_pairs(query_index: Tensor, num_context: int, runs: bool = True) -> float:
    """(query, key) pairs the attention of `query_index` (sorted) over `num_context` keys
    computes in one layer: each run's (`QueryRun.pairs`) for few runs (`runs`: the run-split
    path is available), each block's rows against the keys up to its last query otherwise."""
    n = len(query_index)
    if n == 0:
        return 0.0
    if n == num_context:
        return float((query_index + 1).sum())
    if runs and len(query_runs(query_index)) <= MAX_RUNS:
        return float(sum(r.pairs for r in runs_of(query_index)))
    bounds = _block_bounds(n)
    return float(
        sum((r1 - r0) * (int(query_index[r1 - 1]) + 1) for r0, r1 in itertools.pairwise(bounds))
    )


def _block_bounds(n: int) -> list[int]:
    step = -(-n // BLOCKS)
    return [*range(0, n, step), n]
