"""CacheBlend's ranking: the key deviation at the check layer, largest first."""

from __future__ import annotations

from torch import Tensor

from agentcache.reuse.ranking.base import DEVIATION, RANKERS, RankingView, TokenRanker


@RANKERS.register("deviation")
class KeyDeviation(TokenRanker):
    """d_i = ||K_i(fresh) - K_i(cached)||^2 at the first layer whose keys see context."""

    name = "deviation"
    reads = frozenset({DEVIATION})

    def scores(self, view: RankingView) -> Tensor:
        assert view.deviation is not None
        return view.deviation.clone()
