"""`promptcache` (PDC): reuse a segment only where it was cached at the same absolute start.

Each (segment, start) pair is its own store entry, so a segment seen at three starts costs
three position versions; reuse is exact only when everything before it is unchanged too, and
approximate (no recompute) otherwise.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PrefillResult,
    ReuseContext,
    ReuseStats,
    ReuseStrategy,
    compute_subset,
    guarded,
)
from agentcache.reuse.guard import computed_cost, loaded
from agentcache.reuse.runs import exact_mask
from agentcache.reuse.segments import commit_segments, find_hits

NAMESPACE = "pdc"


@STRATEGIES.register("promptcache")
class PromptCache(ReuseStrategy):
    name = "promptcache"

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
        hits = find_hits(ctx, prompt, stats, NAMESPACE, at_start=True)
        seq.extend(prompt.num_tokens)
        t0 = time.perf_counter()
        slots = seq.slots()
        computed = torch.ones(prompt.num_tokens, dtype=torch.bool)
        for h in hits:
            computed[h.start : h.end] = False
        idx, n = computed.nonzero().flatten(), int((~computed).sum())
        plan = computed_cost(idx, prompt.num_tokens, ctx.model.config.num_layers) + loaded(n)
        if hits and guarded(ctx, prompt.num_tokens, plan, stats):
            hits, computed[:] = [], True
        for h in hits:
            span = slice(h.start, h.end)
            seq.write_all(slots[span], h.kv.keys[:, : h.num_tokens], h.kv.values[:, : h.num_tokens])
        stats.load_s = time.perf_counter() - t0
        stats.reused_tokens = stats.loaded_tokens = int((~computed).sum())
        stats.reused = ~computed
        stats.exact = exact_mask(prompt, hits, torch.arange(prompt.num_tokens))
        logits = compute_subset(ctx, prompt, seq, computed.nonzero().flatten(), stats)
        stats.close()
        return PrefillResult(logits, torch.arange(prompt.num_tokens), stats)

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        commit_segments(ctx, prompt, seq, positions, NAMESPACE, at_start=True)
