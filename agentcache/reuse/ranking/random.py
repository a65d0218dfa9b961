"""The ablation: the same budget, tokens drawn at random (seeded)."""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.reuse.ranking.base import RANKERS, RankingView, TokenRanker


@RANKERS.register("random")
class RandomTokens(TokenRanker):
    """One draw per prompt token, so a token's score does not depend on the other candidates."""

    name = "random"

    def scores(self, view: RankingView) -> Tensor:
        g = torch.Generator().manual_seed(self.config.seed)
        return torch.rand(view.num_tokens, generator=g)[view.candidates]
