"""Who computes what reuse cannot supply, per turn (no vLLM): a staged prefill where vLLM
computes every token (stages.py), or the connector's engine filling the span.

    fill="engine"  the connector's engine, every turn
    fill="vllm"    a staged prefill (positional strategies only; checked in VLLMConfig)
    fill="auto"    for a strategy that selects up front: staged, or the engine when it has
                   measured faster (`FillChooser`); for one that ranks while it runs: the
                   engine, or vLLM computing everything after the stored exact prefix (the
                   connector loads that prefix where vLLM's cache lost it); nothing stored:
                   no choice
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentcache.engines.vllm.config import VLLMConfig
from agentcache.engines.vllm.stages import (
    FillChooser,
    StagePlan,
    engine_tokens,
    exact_prefix_plan,
    exact_prefix_tokens,
    plan_prompt,
    select_from_store,
    staged_strategy,
)
from agentcache.engines.vllm.storage import FolderSegmentStore, StoredMeta
from agentcache.kv.store import segment_content_id
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse import StrategySpec
from agentcache.reuse.selective import SelectiveRecompute


@dataclass(frozen=True)
class FillDecision:
    """A turn's fill: the stages to run (None: the connector's engine fills the span), who
    fills, and whether that was chosen on measurements (then the turn's TTFT is one)."""

    plan: StagePlan | None
    fill: str
    chosen: bool
    # the reusable segments the store lacked when the plan was made (a staged turn reports
    # those vLLM computed whole as new)
    unstored: tuple[TokenizedSegment, ...] = ()


@dataclass
class FillDecider:
    """Decides each turn's fill from what the store holds now (its metadata: `plan_store`
    holds no KV) and, under `fill="auto"`, from measured costs per strategy spec."""

    config: VLLMConfig
    plan_store: FolderSegmentStore
    store_ids: tuple[str, str]  # (model id, tokenizer id) of the store's keys
    choosers: dict[str, FillChooser] = field(default_factory=dict)

    def strategy(self, name: str | None) -> str:
        """A strategy spec, validated (unknown names list the known ones)."""
        name = name or self.config.strategy
        StrategySpec.parse(name)
        return name

    def chooser(self, strategy: str | None = None) -> FillChooser:
        """`fill="auto"`'s measurements for a strategy spec (each has its own costs)."""
        return self.choosers.setdefault(self.strategy(strategy), FillChooser())

    def selective(self, strategy: str | None) -> SelectiveRecompute | None:
        """The selective strategy whose turns can leave computing to vLLM (checked to run
        staged under `fill="vllm"`), or None when the connector's engine fills every turn: no
        connector, `fill="engine"`, or a strategy that is not selective (full, prefix, ...)."""
        c = self.config
        if c.reuse != "agentcache" or c.fill == "engine":
            return None
        spec = StrategySpec.parse(self.strategy(strategy))
        built = staged_strategy(spec) if c.fill == "vllm" else spec.build()
        return built if isinstance(built, SelectiveRecompute) else None

    def stage_plan(
        self,
        tokens: TokenizedPrompt,
        strategy: SelectiveRecompute,
        meta: Callable[[TokenizedSegment], StoredMeta | None] | None = None,
    ) -> StagePlan:
        """Which tokens vLLM computes, and in which requests, from what the store holds now
        (`meta`, default `self.meta`: a segment's stored metadata)."""
        c = self.config
        return plan_prompt(tokens, strategy, meta or self.meta, c.block_size, c.min_stage_tokens)

    def meta(self, seg: TokenizedSegment) -> StoredMeta | None:
        model_id, tokenizer_id = self.store_ids
        cid = segment_content_id(seg.ids, seg.segment.scope)
        return self.plan_store.meta(model_id, tokenizer_id, cid)

    def decide(self, tokens: TokenizedPrompt, strategy: str | None) -> FillDecision:
        c = self.config
        built = self.selective(strategy)
        if built is None:
            return FillDecision(None, "engine", False)
        lacked: list[TokenizedSegment] = []  # each segment's metadata is read once, here

        def meta(seg: TokenizedSegment) -> StoredMeta | None:
            found = self.meta(seg)
            if found is None:
                lacked.append(seg)
            return found

        if built.up_front:
            plan = self.stage_plan(tokens, built, meta)
            if c.fill == "vllm" or plan.num_reused == 0:  # nothing to reuse: vLLM either way
                return FillDecision(plan, "vllm", False, tuple(lacked))
            fill = self.chooser(strategy).choose(plan.num_computed, plan.requested)
            return FillDecision(plan, fill, True, tuple(lacked))
        # the strategy ranks tokens while it runs: its engine fills the span, or vLLM computes
        # everything after the stored exact prefix, which the connector supplies where vLLM's
        # own prefix cache no longer holds it
        selection, runs = select_from_store(tokens, built, meta)
        if not runs:
            return FillDecision(None, "engine", False)  # nothing stored: nothing is claimed
        hit = exact_prefix_tokens(runs, c.block_size)
        fill = self.chooser(strategy).choose(tokens.num_tokens - hit, engine_tokens(selection))
        if fill == "engine":
            return FillDecision(None, fill, True)
        plan = exact_prefix_plan(tokens.num_tokens, hit, c.block_size)
        return FillDecision(plan, fill, True, tuple(lacked))
