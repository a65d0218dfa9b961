"""WCA (CacheSlide's weighted correction attention): fusion of fresh into cached K/V, and the
gate that drops converged tokens from the recompute set every `gate_every` layers.

    layer c (check) : S_k = top rho of reused tokens by deviation
    layers > c      : K_i <- a_i K_i(fresh) + (1 - a_i) K_i(cached), a_i = ||dK||^2/||K_c||^2
    every n layers  : 1 - CKSim(K_i fresh, K_i cached) < tau -> i converged, leaves S_k;
                      with promotion "catch-up" the next-ranked token joins, its hidden state
                      brought up from the check layer over the K/V there (`Gate`)
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from agentcache.reuse.layers import TimedForward
from agentcache.tiers.overlay import DirectKV


class TokenLayerCount(Protocol):
    token_layers_computed: float


class GateHost(Protocol):
    """What the gate uses of the layer executor that runs it (reuse/executor.py)."""

    @property
    def f(self) -> TimedForward: ...
    @property
    def kv(self) -> DirectKV: ...
    @property
    def positions(self) -> Tensor: ...
    @property
    def stats(self) -> TokenLayerCount: ...

    def catch_up(self, hidden: Tensor, idx: Tensor, first: int, last: int) -> Tensor: ...
    def write(self, layer: int, idx: Tensor, k: Tensor, v: Tensor, fused: Tensor) -> None: ...
    def attend(self, layer: int, hidden: Tensor, q: Tensor, idx: Tensor) -> Tensor: ...


def wca_weight(k_fresh: Tensor, k_cached: Tensor) -> Tensor:
    """a_i = ||K_fresh - K_cached||^2 / ||K_cached||^2, clamped to [0, 1]. (n, H, D) -> (n,)"""
    num = (k_fresh - k_cached).pow(2).sum(dim=(1, 2))
    den = k_cached.pow(2).sum(dim=(1, 2)).clamp_min(1e-12)
    return (num / den).clamp(0.0, 1.0)


def cksim(k_fresh: Tensor, k_cached: Tensor) -> Tensor:
    """Mean over heads of the cosine between fresh and cached keys. (n, H, D) -> (n,)"""
    return torch.nn.functional.cosine_similarity(k_fresh, k_cached, dim=-1).mean(dim=-1)


def fuse(
    kv: DirectKV, layer: int, idx: Tensor, k: Tensor, v: Tensor, fused: Tensor
) -> tuple[Tensor, Tensor]:
    """K/V of `idx` to write at `layer`: rows of mask `fused` blended with their cached K/V
    by the WCA weight, the others fresh. New tensors; `k`, `v` are not modified."""
    ck, cv = kv.cached(layer, idx[fused])
    a = wca_weight(k[fused], ck)[:, None, None]
    k, v = k.clone(), v.clone()
    k[fused] = a * k[fused] + (1 - a) * ck
    v[fused] = a * v[fused] + (1 - a) * cv
    return k, v


class Gate:
    """The recompute set S_k after the check layer, gated every few layers."""

    def __init__(
        self,
        tau: float,
        promote: bool,
        check_layer: int,
        ranked: Tensor,
        selected: Tensor,
        hidden_check: Tensor,
        all_idx: Tensor,
    ) -> None:
        self.tau = tau
        self.promote = promote  # refill the set after removals ("catch-up")
        self.check_layer = check_layer
        self.waiting = list(ranked.tolist())  # the ranking's order, best first
        self.selected = selected.clone()  # (T,) S_k
        self.hidden_check = hidden_check  # hidden states entering the check layer, rows all_idx
        self.all_idx = all_idx

    def step(self, ex: GateHost, layer: int, q_idx: Tensor, hidden: Tensor) -> tuple[
        Tensor, Tensor
    ]:  # fmt: skip
        """One layer whose row set changes after projecting: converged rows leave, promoted
        rows join, then the rest of the layer. Returns (q_idx, hidden) after it."""
        q, k, v = ex.f.project(layer, hidden, ex.positions[q_idx])
        converged = self.selected[q_idx] & (1 - cksim(k, ex.kv.cached(layer, q_idx)[0]) < self.tau)
        self.selected[q_idx[converged]] = False
        keep = ~converged
        q_idx, hidden, q, k, v = q_idx[keep], hidden[keep], q[keep], k[keep], v[keep]
        n_new = int(converged.sum()) if self.promote else 0
        if n_new and self.waiting:
            new_idx = torch.tensor(sorted(self.waiting[:n_new]), dtype=torch.int64)
            self.waiting = self.waiting[n_new:]
            rows = torch.searchsorted(self.all_idx, new_idx)
            h_new = ex.catch_up(self.hidden_check[rows], new_idx, self.check_layer, layer)
            q_new, k_new, v_new = ex.f.project(layer, h_new, ex.positions[new_idx])
            self.selected[new_idx] = True
            order = torch.argsort(torch.cat([q_idx, new_idx]))
            q_idx = torch.cat([q_idx, new_idx])[order]
            hidden = torch.cat([hidden, h_new])[order]
            q, k, v = (torch.cat(p)[order] for p in ((q, q_new), (k, k_new), (v, v_new)))
        ex.write(layer, q_idx, k, v, self.selected[q_idx])
        ex.stats.token_layers_computed += len(q_idx)
        return q_idx, ex.attend(layer, hidden, q, q_idx)
