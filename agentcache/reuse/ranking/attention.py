"""Rank by the attention the always-computed tokens pay each reused token."""

from __future__ import annotations

from torch import Tensor

from agentcache.reuse.ranking.base import ATTENTION, RANKERS, RankingView, TokenRanker


@RANKERS.register("attention")
class AttentionPaid(TokenRanker):
    """At the check layer: mean over heads and always-computed queries. In the probe pass:
    summed over probe layers 1.. of the max over the last `window` queries."""

    name = "attention"
    reads = frozenset({ATTENTION})

    def scores(self, view: RankingView) -> Tensor:
        assert view.attention is not None
        return view.attention[view.candidates]
