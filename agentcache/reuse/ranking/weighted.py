"""Rank by key deviation weighted by the attention the always-computed tokens pay."""

from __future__ import annotations

from torch import Tensor

from agentcache.reuse.ranking.base import ATTENTION, DEVIATION, RANKERS, RankingView, TokenRanker


@RANKERS.register("weighted")
class WeightedDeviation(TokenRanker):
    """d_i * attention_i at the check layer: a drifted key matters as much as it is read."""

    name = "weighted"
    reads = frozenset({DEVIATION, ATTENTION})

    def scores(self, view: RankingView) -> Tensor:
        assert view.deviation is not None and view.attention is not None
        return view.deviation * view.attention[view.candidates]
