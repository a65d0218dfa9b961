"""`full`: recompute every token. The reference every other strategy is measured against."""

from __future__ import annotations

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PlannedPrefill,
    PrefillResult,
    ReuseContext,
    ReuseStrategy,
    natural_plan,
    run_planned,
)


@STRATEGIES.register("full")
class FullRecompute(ReuseStrategy):
    name = "full"

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        return run_planned(self.plan_prefill(ctx, prompt, seq), ctx, prompt, seq)

    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill:
        return natural_plan(ctx, prompt, seq)
