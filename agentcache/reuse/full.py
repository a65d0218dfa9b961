"""`full`: recompute every token. The reference every other strategy is measured against."""

from __future__ import annotations

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PlannedPrefill,
    PlanningStrategy,
    ReuseContext,
    natural_plan,
)


@STRATEGIES.register("full")
class FullRecompute(PlanningStrategy):
    name = "full"

    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill:
        return natural_plan(ctx, prompt, seq)
