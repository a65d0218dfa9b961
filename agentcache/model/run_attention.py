"""Causal attention for queries that form a few contiguous runs of the context, at the cost of
plain causal attention: the fast path of `attention.attention` when not every token is computed.

A masked SDPA over (T, S) computes every query against every key, masked or not: a prefill
that computes the last T of S tokens does T * S work where causal attention does about
T * S - T^2 / 2, and on CPU it cannot use the causal kernel. Instead, each run of consecutive
query indices [a, b) attends in two parts, merged by their log-sum-exp:

    keys     : [0 ........ a)[a ..... b)  (keys after b are masked for every query of the run)
    part 1   :  every query of the run sees all of them (no mask)
    part 2   :                each query sees the run's keys up to itself (square, causal)
    out      = (e^lse1 * out1 + e^lse2 * out2) / (e^lse1 + e^lse2)

The merge is exact up to rounding. The kernel that returns the log-sum-exp is PyTorch's CPU
flash attention; elsewhere (other devices), or for scattered query sets (many runs),
`blocked_attention` splits the query rows into `BLOCKS` blocks, each attending with a mask
over the keys up to its last query only (about half the pairs of one masked call).
`tests/model/test_run_attention.py` checks both against `masked_attention`, the reference.
`attention_pairs` counts the (query, key) pairs the path a query set takes computes (the cost
guard, reuse/guard.py, reads it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

# scattered query sets (a ranking's picks) make many short runs: two kernel calls per run
# would cost more than one masked call
MAX_RUNS = 8
BLOCKS = 8
_FLASH: Callable[..., tuple[Tensor, Tensor]] | None = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None
)


def query_runs(query_index: Tensor) -> list[tuple[int, int]]:
    """(start, end) rows of `query_index` (T,), strictly increasing, where it steps by one."""
    breaks = (query_index.diff() != 1).nonzero().flatten().add(1).tolist()
    edges = [0, *breaks, len(query_index)]
    return list(itertools.pairwise(edges))


def runs_attention(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor, scale: float
) -> Tensor | None:
    """q (T, H, Dh) at context indices `query_index` (T,, strictly increasing), keys/values
    (S, Hkv, Dh) -> (T, H*Dh); None when this path does not apply (not CPU, too many runs)."""
    if _FLASH is None or not uses_runs(q, query_index):
        return None
    runs = query_runs(query_index)
    t, h, _ = q.shape
    end = int(query_index[-1]) + 1
    group = h // keys.shape[1]
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
    kh = keys[:end].transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)  # (1, H, S', Dh)
    vh = values[:end].transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    out = torch.empty_like(qh)
    for r0, r1 in runs:
        a, b = int(query_index[r0]), int(query_index[r1 - 1]) + 1
        qr = qh[:, :, r0:r1]
        o2, lse2 = _FLASH(qr, kh[:, :, a:b], vh[:, :, a:b], 0.0, True, scale=scale)
        if a == 0:
            out[:, :, r0:r1] = o2
            continue
        o1, lse1 = _FLASH(qr, kh[:, :, :a], vh[:, :, :a], 0.0, False, scale=scale)
        m = torch.maximum(lse1, lse2)
        w1, w2 = (lse1 - m).exp().unsqueeze(-1), (lse2 - m).exp().unsqueeze(-1)  # (1, H, R, 1)
        out[:, :, r0:r1] = (o1 * w1 + o2 * w2) / (w1 + w2)
    return out[0].transpose(0, 1).reshape(t, -1)


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
    computes in one layer: causal for few runs (`runs`: the run-split path is available),
    each block's rows against the keys up to its last query otherwise."""
    n = len(query_index)
    if n == 0:
        return 0.0
    if n == num_context or (runs and len(query_runs(query_index)) <= MAX_RUNS):
        return float((query_index + 1).sum())
    bounds = _block_bounds(n)
    return float(
        sum((r1 - r0) * (int(query_index[r1 - 1]) + 1) for r0, r1 in itertools.pairwise(bounds))
    )


def _block_bounds(n: int) -> list[int]:
    step = -(-n // BLOCKS)
    return [*range(0, n, step), n]
