"""The check pass (CacheBlend, CacheSlide): rank reused tokens at the check layer c.

layers [0, c) : every token whose KV is not exact computed fresh (rows all_idx)
layer c       : Q/K/V for all_idx; deviation d_i = ||K_i(fresh) - K_i(cached)||^2 and,
                if the ranker reads it, the attention the base tokens pay; S = the top
                `budget` of the candidates with a positive score; the rest of layer c
                for Q = base + S
layers > c    : Q computed (WCA: S fused, gated every `gate_every` layers)
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.executor import LayerExecutor
from agentcache.reuse.ranking import RankingView, TokenRanker
from agentcache.reuse.ranking.base import ATTENTION
from agentcache.reuse.ranking.probs import attention_probs
from agentcache.reuse.runs import ReusedRun
from agentcache.reuse.upfront import UpFrontSelection
from agentcache.reuse.wca import Gate


def checked(
    ex: LayerExecutor,
    sel: UpFrontSelection,
    runs: list[ReusedRun],
    ranker: TokenRanker,
    o: SelectiveOptions,
) -> Tensor:
    """The check-layer prefill; returns first-token logits (V,)."""
    c = o.check_layer
    assert c is not None
    all_idx = (~sel.exact).nonzero().flatten()
    hidden_all = ex.through(ex.embed(all_idx), all_idx, 0, c)
    q, k, v = ex.f.project(c, hidden_all, ex.positions[all_idx])
    fraction = ex.f.config.qkv_fraction()
    ex.stats.token_layers_computed += fraction * len(all_idx)
    cached_k = ex.kv.cached(c, torch.arange(len(ex.ids)))[0]
    cand = (sel.candidates & ~sel.base).nonzero().flatten()
    deviation = (k[torch.searchsorted(all_idx, cand)] - cached_k[cand]).pow(2).sum(dim=(1, 2))
    paid = _paid(ex, c, sel.base, all_idx, q, k, cached_k) if ATTENTION in ranker.reads else None
    view = RankingView(cand, len(ex.ids), runs, sel.base, deviation=deviation, attention=paid)
    selected, ranked = _positive_top(cand, ranker.scores(view), sel.budget, len(ex.ids))
    q_idx = (sel.base | selected).nonzero().flatten()
    pick = torch.searchsorted(all_idx, q_idx)  # rows of q_idx within all_idx
    ex.write(c, q_idx, k[pick], v[pick], selected[q_idx])
    hidden = ex.attend(c, hidden_all[pick], q[pick], q_idx)
    ex.stats.token_layers_computed += (1 - fraction) * len(q_idx)
    if not o.gate_every:
        return ex.logits(
            ex.fused_through(hidden, q_idx, selected[q_idx], range(c + 1, ex.num_layers))
        )
    gate = Gate(o.tau, o.promotion == "catch-up", c, ranked, selected, hidden_all, all_idx)
    layer = c + 1
    while layer < ex.num_layers:
        if layer % o.gate_every == 0:
            q_idx, hidden = gate.step(ex, layer, q_idx, hidden)
            layer += 1
            continue
        stop = min(ex.num_layers, (layer // o.gate_every + 1) * o.gate_every)
        hidden = ex.fused_through(hidden, q_idx, gate.selected[q_idx], range(layer, stop))
        layer = stop
    return ex.logits(hidden)


def _paid(
    ex: LayerExecutor, layer: int, base: Tensor, all_idx: Tensor, q: Tensor, k_fresh: Tensor,
    cached_k: Tensor,
) -> Tensor:  # fmt: skip
    """Mean attention (over heads and the base queries) paid to each token at the check
    layer, with fresh keys where computed. (T,)"""
    keys = cached_k.clone()
    keys[all_idx] = k_fresh
    base_idx = base.nonzero().flatten()
    q_base = q[torch.searchsorted(all_idx, base_idx)]  # (B, H, Dh)
    window = ex.f.spec.window(layer)  # the check layer's own mask: a ranker sees its attention
    return attention_probs(q_base, base_idx, keys, ex.f.scale, window).mean(dim=(0, 1))


def _positive_top(
    cand: Tensor, scores: Tensor, budget: int, num_tokens: int
) -> tuple[Tensor, Tensor]:
    """The top `budget` of the candidates scoring above 0 (the paper's S = {i : d_i > 0}).
    Returns (selected mask (T,), the rest of them in rank order)."""
    keep = scores > 0
    cand, scores = cand[keep], scores[keep]
    order = torch.argsort(scores, descending=True)
    selected = torch.zeros(num_tokens, dtype=torch.bool)
    selected[cand[order[:budget]]] = True
    return selected, cand[order[budget:]]
