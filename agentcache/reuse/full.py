"""`full`: recompute every token. The reference every other strategy is measured against."""

from __future__ import annotations

import torch

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PrefillResult,
    ReuseContext,
    ReuseStats,
    ReuseStrategy,
    compute_subset,
)


@STRATEGIES.register("full")
class FullRecompute(ReuseStrategy):
    name = "full"

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
        seq.extend(prompt.num_tokens)
        logits = compute_subset(ctx, prompt, seq, torch.arange(0, prompt.num_tokens), stats)
        stats.close()
        return PrefillResult(logits, torch.arange(prompt.num_tokens), stats)
