"""Query-aware ranking: the attention the prompt's last tokens pay each reused token, summed
over every layer of a cheap probe that runs only those last tokens.

    context : [ reused (cached K/V, re-rotated) ][ other new tokens ][ window (last W) ]
    probe   : the window through every layer, attending over the reused tokens' cached K/V
              and its own fresh K/V; the other new tokens are not computed yet and are left
              out of its context. Nothing is written: the prefill proper starts afterwards.
    score_i : sum over layers of (max over the window, mean over heads) attention paid to i

Cost: W token-layers per layer (counted), where the check and probe passes run all new tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.model.llama import QKV
from agentcache.reuse.layers import run_layers
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

        def context(layer: int, qkv: QKV) -> tuple[Tensor, Tensor]:
            keys, values = (x[ctx_idx] for x in p.kv.gather(layer))  # copies: kv untouched
            keys[rows], values[rows] = qkv.k, qkv.v
            score.add_(attention_received(qkv.q, rows, keys, p.f.scale))
            return keys, values

        layers = range(p.f.config.num_layers)
        run_layers(p.f, layers, p.f.embed(p.ids[window]), p.positions[window], rows, context)
        p.stats.token_layers_computed += len(window) * len(layers)
        full = torch.zeros(view.num_tokens)
        full[ctx_idx] = score
        return full[view.candidates]
