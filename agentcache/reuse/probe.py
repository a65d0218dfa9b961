"""The probe pass (rpdc): rank reused tokens by the attention the prompt's end pays them.

    layers [0, P)  : Q0 = base tokens computed over the cached KV; the last W of them (the
                     window) score each token by the attention they pay it, summed over
                     layers 1..P-1 (max over the window, mean over heads)
    select         : S = the top `budget` candidates by the ranker's scores
    layers [0, P)  : S computed (its fresh K/V replace cached); with `probe_redo`, the Q0
                     tokens after S's first token are computed again with S
    layers [P, L)  : Q0 + S computed

When S would be every candidate, or (with `probe_redo`) leaving the rest out would save fewer
token-layers than the redo costs, no probe runs: Q0 and every candidate go through all
layers (`probe_shortcut`; exact).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.model.llama import QKV
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.executor import LayerExecutor, top
from agentcache.reuse.layers import run_layers
from agentcache.reuse.ranking import RankingView, TokenRanker
from agentcache.reuse.ranking.probs import attention_received
from agentcache.reuse.runs import ReusedRun
from agentcache.reuse.upfront import UpFrontSelection


def probed(
    ex: LayerExecutor,
    sel: UpFrontSelection,
    runs: list[ReusedRun],
    ranker: TokenRanker,
    o: SelectiveOptions,
) -> Tensor:
    """The probe prefill; returns first-token logits (V,)."""
    probe = min(o.probe_layers, ex.num_layers // 2)  # selected tokens need layers after it
    q_idx = sel.base.nonzero().flatten()
    cand = (sel.candidates & ~sel.base).nonzero().flatten()
    budget = min(len(cand), sel.budget)
    if o.probe_shortcut and select_all(o.probe_redo, q_idx, cand, budget, probe, ex.num_layers):
        ex.stats.probe_skipped = True  # the probe could only rank tokens computed anyway
        return ex.plain((sel.base | sel.candidates).nonzero().flatten())
    hidden, score = _probe(ex, q_idx, probe, o.probe_window)
    view = RankingView(cand, len(ex.ids), runs, sel.base, attention=score)
    s_idx = top(cand, ranker.scores(view), budget)
    if budget == 0:  # nothing to promote: finish the probe set
        return ex.logits(ex.through(hidden, q_idx, probe, ex.num_layers))
    # probe states kept: all of Q0, or with probe_redo only Q0 up to S's first token
    keep = q_idx < s_idx[0] if o.probe_redo else torch.ones_like(q_idx, dtype=torch.bool)
    low = torch.cat([s_idx, q_idx[~keep]]).sort().values
    h_low = ex.through(ex.embed(low), low, 0, probe)
    merged = torch.cat([q_idx[keep], low])
    order = torch.argsort(merged)
    q_idx, hidden = merged[order], torch.cat([hidden[keep], h_low])[order]
    return ex.logits(ex.through(hidden, q_idx, probe, ex.num_layers))


def _probe(ex: LayerExecutor, q_idx: Tensor, probe: int, window: int) -> tuple[Tensor, Tensor]:
    """Q0 through the probe layers, writing its K/V; returns its hidden states and the
    window's attention score of every token (T,)."""
    score = torch.zeros(len(ex.ids))
    w_idx = q_idx[-window:]

    def context(layer: int, qkv: QKV) -> tuple[Tensor, Tensor]:
        ex.kv.write(layer, q_idx, qkv.k, qkv.v)
        keys, values = ex.kv.gather(layer)
        if layer >= 1:
            ex.dirty[q_idx] = True
            q_w, window = qkv.q[-len(w_idx) :], ex.f.spec.window(layer)
            score.add_(attention_received(q_w, w_idx, keys, ex.f.scale, window))
        return keys, values

    positions = ex.positions[q_idx]
    hidden = run_layers(ex.f, range(probe), ex.embed(q_idx), positions, q_idx, context)
    ex.stats.token_layers_computed += len(q_idx) * probe
    ex.ever_computed[q_idx] = True
    return hidden, score


def select_all(
    redo: bool, q_idx: Tensor, cand: Tensor, budget: int, probe: int, num_layers: int
) -> bool:
    """Whether computing every candidate costs no more token-layers than the probe path.

    The probe path computes the base and `budget` candidates through every layer, plus, with
    `probe_redo`, the probe layers again for the base tokens after the first selected one;
    at the least, those after `cand[n - budget]` (the latest the first selected can be).
    Computing all instead adds the `n - budget` unselected candidates through every layer."""
    n = len(cand)
    if n == 0:
        return False
    if budget >= n:
        return True
    if not redo or budget == 0:
        return False
    redo_min = int((q_idx > cand[n - budget]).sum())
    return (n - budget) * num_layers <= redo_min * probe
