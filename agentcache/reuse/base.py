"""The strategy seam: every reuse method, baselines included, behind one interface."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.kv.pool import PagePool, SequenceKV
from agentcache.kv.store import MissReason, SegmentStore
from agentcache.model.llama import QKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.registry import Registry
from agentcache.reuse.guard import CostModel, GuardDecision, PlanCost, full_cost, guard
from agentcache.reuse.layers import TimedForward, run_layers
from agentcache.reuse.options import OptionType


@dataclass(frozen=True)
class ReuseContext:
    """What a strategy may use: the model, the shared segment store, the fast-tier page pool."""

    model: LoadedModel
    store: SegmentStore
    pool: PagePool
    decoupled_load: bool = False  # SLIDE: land cached KV layer by layer on a loader thread
    # a plan predicted to cost more than full recompute is not taken (reuse/guard.py);
    # False takes every plan (the mechanics of a strategy, measured as they are)
    cost_guard: bool = True
    # a segment's context copy (reuse/segments.py) may serve as an exact run; False where the
    # output must equal full recompute's (the planner's exact floor)
    context_copies: bool = True
    # an update's opening shared with a segment stored after this very context is found as an
    # exact run (its head, reuse/segments.py); False where the computed tokens must be the
    # ones a plan chose from the store's metadata alone (the vLLM connector's staged prefill:
    # vLLM's prefix cache serves that opening)
    update_heads: bool = True


@dataclass(frozen=True)
class SegmentMiss:
    segment_id: str | None
    kind: str
    num_tokens: int
    reason: MissReason


@dataclass
class ReuseStats:
    """What one prefill reused and computed. token-layers: (token, layer) pairs computed."""

    prompt_tokens: int
    num_layers: int
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    token_layers_computed: float = 0.0  # fractional: a Q/K/V-only pass counts its FLOP share
    fallbacks: int = 0
    fallback_reasons: list[str] = field(default_factory=list)
    misses: list[SegmentMiss] = field(default_factory=list)
    lookup_s: float = 0.0  # finding the prompt's stored KV (hashing, store lookups)
    load_s: float = 0.0
    # writing fresh K/V into the sequence and gathering each layer's context K/V for attention
    assemble_s: float = 0.0
    load_overlap: float | None = None  # share of the load hidden behind compute (decoupled)
    # probe strategies: every candidate was computed because the budget covered them all, or
    # the probe's redo would have cost more than the few it left out (no ranking ran)
    probe_skipped: bool = False
    # selective strategies with `epic_over`: the budget was thin beside the candidates, so the
    # turn computed their chunk starts instead of a ranking (reuse/upfront.py)
    epic_turn: bool = False
    # selective strategies: every reused token whose KV is not exact was computed through
    # every layer, decided up front (the output is full recompute's, up to rounding)
    exact_plan: bool = False
    # selective strategies: reused tokens whose KV is not exact here and not computed anyway
    # (what a ranking chooses from), and the tokens computed anyway (update tokens, misses,
    # boundary, last; an up-front ranker's picks among them): the budget's basis
    candidates: int = 0
    computed_anyway: int = 0
    compute_s: float = 0.0  # time inside the model's layer calls (TimedForward)
    model_calls: int = 0  # calls into the model: embed, per-layer project/attend, logits
    loaded_tokens: int = 0  # tokens whose cached K/V was written into the sequence
    copies_found: int = 0  # segments found as their exact copy for this context (segments.py)
    # segments found as their context copy for this context (segments.py), and their tokens
    # reused: KV an earlier turn used there approximately, not full recompute's
    context_copies_found: int = 0
    context_copy_tokens: int = 0
    # tokens reused exactly from the opening of a stored segment whose text changed since
    # (segments.py "Heads")
    head_tokens: int = 0
    # the cost guard's decision on the plan (reuse/guard.py); None: no plan beside `full`'s
    guard: GuardDecision | None = None
    # what the prefill spent besides computing tokens: lookup, loading, re-rotation,
    # assembling K/V, probe scoring and ranking (wall time less compute_s; set by `close`)
    overhead_s: float = 0.0
    started: float = field(default_factory=time.perf_counter, repr=False)
    # reused tokens whose K/V was recomputed or fused at layer >= 1: they differ from the
    # stored copy (re-rotation alone does not count: the stored copy reproduces it). (T,)
    dirty: Tensor | None = None
    # (T,) bool: tokens whose KV was found and loaded (`reused_tokens` of them), and of those,
    # the ones whose stored copy is exact here (stored after this very context, at these
    # positions). None: the strategy reused nothing. Read by `runtime.stats.TokenReuse`.
    reused: Tensor | None = None
    exact: Tensor | None = None

    @property
    def recompute_fraction(self) -> float:
        return self.token_layers_computed / max(1, self.prompt_tokens * self.num_layers)

    def close(self) -> None:
        """The prefill is done: its overhead is the time since `started` not spent computing."""
        self.overhead_s = max(0.0, time.perf_counter() - self.started - self.compute_s)

    @property
    def guarded(self) -> bool:
        """The plan was predicted to cost more than full recompute, which ran instead."""
        return self.guard is not None and not self.guard.taken

    def fallback(self, reason: str) -> None:
        self.fallbacks += 1
        self.fallback_reasons.append(reason)


@dataclass(frozen=True)
class PrefillResult:
    logits: Tensor  # (V,) logits of the token after the prompt
    positions: Tensor  # (T,) position id each prompt token was encoded at
    stats: ReuseStats


@dataclass(eq=False)
class PlannedPrefill:
    """A prefill handed over before any layer runs: lookup, load and guard done, `seq` extended
    to the prompt and the loaded K/V written; left to do: compute tokens `computed` (sorted,
    the last token last) at their natural positions (`compute_subset`: in one pass, `run`, or
    a few at a time, `runtime/chunked.py`), then `finish` with the last token's logits.

        lookup -> load -> guard -> PlannedPrefill -> compute `computed` -> finish(logits)

    `after` is the strategy's bookkeeping once every computed token ran (its stats fields,
    the exact K/V it leaves for `commit`): the same whichever way the tokens were computed."""

    computed: Tensor
    positions: Tensor  # (T,) the positions the prompt is encoded at (its tokens' own indices)
    stats: ReuseStats
    after: Callable[[], None] | None = None

    def finish(self, logits: Tensor) -> PrefillResult:
        """The prefill's result, once every computed token ran; `logits`: the last token's."""
        if self.after is not None:
            self.after()
        self.stats.close()
        return PrefillResult(logits, self.positions, self.stats)

    def run(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        """Every computed token in one pass: the whole prefill (the reference for chunks)."""
        return self.finish(compute_subset(ctx, prompt, seq, self.computed, self.stats))


def natural_plan(ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PlannedPrefill:
    """`full`'s plan: every token computed at its own position, nothing loaded."""
    stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
    seq.extend(prompt.num_tokens)
    natural = torch.arange(prompt.num_tokens)
    return PlannedPrefill(natural, natural, stats)


STRATEGIES: Registry[ReuseStrategy] = Registry("reuse strategy")


class ReuseStrategy(ABC):
    """Assembles the KV of every prompt token in `seq` and returns the first-token logits.

    Contract:
    - `prefill` receives an empty `seq`, extends it to exactly `prompt.num_tokens` tokens and
      writes K/V for every layer and token; the last prompt token is always computed fresh.
    - It reads the store (counters move) but never writes it; `commit` writes what later turns
      may reuse, after generation, given the positions the prompt was encoded at.
    - With nothing reusable it computes everything (not a fallback); when it had reusable KV but
      could not use it, it counts a fallback with a reason in `stats`.
    - The store only returns entries of the same model and tokenizer; strategies rely on that.
    - `stats` is made when `prefill` starts and closed (`ReuseStats.close`) when it returns;
      model calls go through `TimedForward`, so `stats.overhead_s` is what the strategy
      spent besides computing tokens.
    - `plan_prefill` may hand the plan over instead (`PlannedPrefill`): everything `prefill`
      does but computing the planned tokens and what follows them (`PlannedPrefill.finish`),
      so the runtime may compute them in chunks (`runtime/chunked.py`); run whole it is
      `prefill` (`PlanningStrategy` derives `prefill` from it).
    """

    name: ClassVar[str]

    def __init__(self, **options: Any) -> None:
        if options:
            raise ConfigError(f"{self.name} takes no options, got {sorted(options)}")

    @property
    def up_front(self) -> bool:
        """Whether it selects the tokens to compute before any layer runs, from the prompt and
        the store's metadata alone (so a vLLM staged prefill can run it). Default: False."""
        return False

    @classmethod
    def option_types(cls) -> dict[str, OptionType]:
        """Every option the strategy takes, with its type (a spec's text is read as it)."""
        return {}

    @abstractmethod
    def prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PrefillResult: ...

    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill | PrefillResult:
        """`prefill`, handing its plan over before any layer runs when its computed tokens are
        known up front at their natural positions (`PlannedPrefill`: the caller computes them,
        whole or in chunks, and finishes it); else the prefill run whole, as `prefill` runs it
        (its lookup is done once either way). Default: whole. A strategy that plans is a
        `PlanningStrategy`."""
        return self.prefill(ctx, prompt, seq)

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        """Store KV for later turns. Default: nothing."""
        return None


class PlanningStrategy(ReuseStrategy):
    """A strategy that plans (`plan_prefill`); its `prefill` is that plan run whole."""

    @abstractmethod
    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill | PrefillResult: ...

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        planned = self.plan_prefill(ctx, prompt, seq)
        return planned.run(ctx, prompt, seq) if isinstance(planned, PlannedPrefill) else planned


def guarded(ctx: ReuseContext, num_tokens: int, plan: PlanCost, stats: ReuseStats) -> bool:
    """Record the guard's decision on `plan` in `stats`; True when the plan must not run
    (`ctx.cost_guard` and it is predicted to cost more than full recompute)."""
    c = ctx.model.config
    decision = guard(plan, full_cost(num_tokens, c.num_layers), CostModel.of(c))
    if not ctx.cost_guard:
        decision = replace(decision, taken=True)
    stats.guard = decision
    return not decision.taken


def compute_subset(
    ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, idx: Tensor, stats: ReuseStats
) -> Tensor:
    """Compute tokens `idx` (sorted, last token included) at their natural positions, attending
    over whatever K/V `seq` holds for the others (written for every layer). Returns last-token
    logits (V,). With every token in `idx` it is a plain causal prefill."""
    f = TimedForward(ctx.model.forward, stats)
    every_token = len(idx) == seq.num_tokens
    slots = seq.slots()[idx]
    gather = context_reader(seq)

    def context(layer: int, qkv: QKV) -> tuple[Tensor, Tensor]:
        t0 = time.perf_counter()
        seq.write(layer, slots, qkv.k, qkv.v)
        kv = (qkv.k, qkv.v) if every_token else gather(layer)
        stats.assemble_s += time.perf_counter() - t0
        return kv

    hidden = f.embed(torch.tensor(prompt.ids, dtype=torch.int64)[idx])
    num_layers = f.config.num_layers
    hidden = run_layers(f, range(num_layers), hidden, idx, None if every_token else idx, context)
    stats.recomputed_tokens += len(idx)
    stats.token_layers_computed += len(idx) * num_layers
    return f.logits(hidden[-1:])[0]


def context_reader(seq: SequenceKV) -> Callable[[int], tuple[Tensor, Tensor]]:
    """Layer -> the sequence's K/V (S, Hkv, Dh) in token order: views of the pool when its
    slots are one ascending run (no copy), else `seq.gather`'s copies."""
    slots = seq.slots()
    if len(slots) == 0 or not bool((slots.diff() == 1).all()):
        return seq.gather
    span = slice(int(slots[0]), int(slots[-1]) + 1)
    pool = seq.pool
    return lambda layer: (pool.keys[layer][span], pool.values[layer][span])
