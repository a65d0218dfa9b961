"""Query-aware ranking: the attention the prompt's last tokens pay each reused token, summed
over every layer of a cheap probe that runs only those last tokens.

    context : [ reused (cached K/V, re-rotated) ][ other new tokens ][ window (last W) ]
    probe   : the window through every layer, attending over the reused tokens' cached K/V
              and its own fresh K/V; the other new tokens are not computed yet and are left
              out of its context. Nothing is written: the prefill proper starts afterwards.
    score_i : sum over layers of (max over the window, mean over heads) attention paid to i

On a sliding-window layer each window token sees the reused tokens within W prompt tokens
of it (counted in prompt indices, not in the probe's rows).

Cost: W token-layers per layer (counted), where the check and probe passes run all new tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.reuse.ranking.base import MODEL, RANKERS, RankingView, TokenRanker
from agentcache.reuse.ranking.probs import attention_received


@RANKERS.register("query")
class QueryAttention(TokenRanker):
    name = "query"
    reads = frozenset({MODEL})

    def scores(self, view: RankingView) -> Tensor:
        p = view.prefill
        assert p is not None
        window = view.base.nonzero().flatten()[-self.config.window :]
        seen = ~view.base  # reused tokens, with their cached K/V
        seen[window] = True
        ctx_idx = seen.nonzero().flatten()  # (S,) the probe's context, in prompt order
        rows = torch.searchsorted(ctx_idx, window)  # the window's rows in it
        score = torch.zeros(len(ctx_idx))
        f = p.f
        hidden = f.embed(p.ids[window])
        for layer in range(f.config.num_layers):
            qkv = f.project(layer, hidden, p.positions[window])
            keys, values = (x[ctx_idx] for x in p.kv.gather(layer))  # copies: kv untouched
            keys[rows], values[rows] = qkv.k, qkv.v
            w = f.spec.window(layer)
            if w is None:  # causal over the rows: the same order as prompt indices
                score.add_(attention_received(qkv.q, rows, keys, f.scale))
                hidden = f.attend(layer, hidden, qkv.q, keys, values, rows)
                continue
            # a sliding window counts prompt tokens, and the rows skip some: mask by index
            score.add_(attention_received(qkv.q, window, keys, f.scale, w, ctx_idx))
            hidden = f.attend_masked(layer, hidden, qkv.q, keys, values, window, ctx_idx)
        p.stats.token_layers_computed += len(window) * f.config.num_layers
        full = torch.zeros(view.num_tokens)
        full[ctx_idx] = score
        return full[view.candidates]
