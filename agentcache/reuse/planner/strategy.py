"""`plan`: per turn, the cheapest plan whose predicted fidelity meets the floor.

    metadata  : hits from the planner's own commit history and the store's presence checks
                (no lookup counted), the tokens `prefix` would reuse
    estimate  : per plan, `PlanSignals` -> its work over full's (the cost guard's units) and
                predicted KL (predictor.py)
    choose    : choice.py; the chosen plan's strategy prefills, unchanged
    commit    : every plan's store entries (prefix blocks and segments), so that any plan can
                run next turn

A turn whose predictor cannot run (no predictor for the model, a stored segment of unknown
origin) runs the cheapest exact plan and counts a fallback with the reason. A turn with
nothing stored is not a fallback: every plan computes everything, and `full` runs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import cast

from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    STRATEGIES,
    PrefillResult,
    ReuseContext,
    ReuseStrategy,
)
from agentcache.reuse.guard import CostModel
from agentcache.reuse.options import OPTION_TYPES, OptionType
from agentcache.reuse.planner.candidates import (
    CANDIDATES,
    DEFAULT_PLANS,
    PREFIX,
    PlanSignals,
    check_plans,
    plan_signals,
)
from agentcache.reuse.planner.choice import (
    EXACT_FLOOR,
    Estimate,
    Floor,
    check_fidelity,
    choose,
)
from agentcache.reuse.planner.history import PlanHistory, StoreProbe, Unknown
from agentcache.reuse.planner.predictor import Predictor, load_predictor, shipped_predictor
from agentcache.reuse.planner.stats import PlannedStats, PlanReport
from agentcache.reuse.prefix import PrefixReuse, block_chain, chain_scope
from agentcache.reuse.runs import StoredHit
from agentcache.reuse.segments import commit_segments, head_index

DEFAULT_FIDELITY = "high"


@STRATEGIES.register("plan")
class PlannedReuse(ReuseStrategy):
    """Options: `fidelity` exact | high (default) | balanced, or `kl=x` (a bound in nats on
    both predicted KLs, overriding fidelity); `predictor` a predictor file (default: the one
    shipped for the model); `plans` the candidates, `+`-separated; `min_gain` the share of
    full's TTFT an approximate plan must save over the cheapest exact one."""

    name = "plan"

    def __init__(
        self, fidelity: str = DEFAULT_FIDELITY, kl: float = 0.0, predictor: str = "",
        plans: str = "+".join(DEFAULT_PLANS), min_gain: float = 0.02,
    ) -> None:  # fmt: skip
        check_fidelity(fidelity, kl)
        if not 0.0 <= min_gain < 1.0:
            raise ConfigError(f"min_gain must be in [0, 1), got {min_gain:g}")
        self.fidelity, self.kl, self.min_gain = fidelity, kl, min_gain
        self.plans = check_plans(tuple(p for p in plans.split("+") if p))
        self.given: Predictor | None = load_predictor(Path(predictor)) if predictor else None
        if self.given is not None:
            self._floor(self.given)  # a floor the file does not define is an error now
        self.strategies = {n: CANDIDATES[n].build() for n in self.plans}
        self.history = PlanHistory()
        self._shipped: dict[str, Predictor | None] = {}

    @classmethod
    def option_types(cls) -> dict[str, OptionType]:
        t = OPTION_TYPES
        return {"fidelity": t["str"], "kl": t["float"], "predictor": t["str"],
                "plans": t["str"], "min_gain": t["float"]}  # fmt: skip

    def _floor(self, p: Predictor | None) -> Floor:
        if self.kl > 0:
            return Floor(f"kl={self.kl:g}", self.kl, self.kl)
        if self.fidelity == "exact":
            return EXACT_FLOOR
        if p is None:  # no predictor: only exact plans meet it (the turn is counted)
            return Floor(self.fidelity, 0.0, 0.0)
        if self.fidelity not in p.floors:
            raise ConfigError(f"plan predictor for {p.model_id} defines no {self.fidelity} floor")
        b = p.floors[self.fidelity]
        return Floor(self.fidelity, b.first, b.tf)

    def predictor(self, model_id: str) -> Predictor | None:
        """The predictor for `model_id`: the file given (of another model: an error), else
        the shipped one (None when there is none)."""
        if self.given is not None:
            self.given.check_model(model_id)
            return self.given
        if model_id not in self._shipped:
            self._shipped[model_id] = shipped_predictor(model_id)
        return self._shipped[model_id]

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        started = time.perf_counter()
        predictor = self.predictor(ctx.model.model_id)  # before any model work
        floor = self._floor(predictor)
        estimates, why = self.estimates(ctx, prompt, predictor, floor)
        used = EXACT_FLOOR if why else floor
        chosen = choose(estimates, used, self.min_gain)
        report = PlanReport(chosen.plan, floor.name, chosen, tuple(estimates),
                            time.perf_counter() - started, why)  # fmt: skip
        if used.exact_only:  # a context copy is not full recompute's KV
            ctx = replace(ctx, context_copies=False)
        pre = self.strategies[chosen.plan].prefill(ctx, prompt, seq)
        stats = PlannedStats.of(pre.stats, report, started)
        if why:
            stats.fallback(f"plan: {why}; ran {chosen.plan}")
        return PrefillResult(pre.logits, pre.positions, stats)

    def estimates(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, p: Predictor | None, floor: Floor
    ) -> tuple[list[Estimate], str | None]:
        """Every plan's estimate, and why the predictor could not run (None when it ran, or
        was not needed: an exact floor, or nothing stored)."""
        m = ctx.model

        def held(cid: str) -> bool:
            return ctx.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid)

        try:
            index = head_index(ctx.store)
            hits: list[StoredHit] = list(self.history.hits(prompt, held, index, ctx.update_heads))
        except Unknown as e:  # an exact floor needed no prediction: not a fallback
            return self._exact_only(), None if floor.name == EXACT_FLOOR.name else str(e)
        prefix = self._prefix_tokens(ctx, prompt, held) if PREFIX in self.plans else 0
        costs = CostModel.of(m.config)
        signals = [plan_signals(CANDIDATES[n], self.strategies[n], prompt, hits, prefix, costs)
                   for n in self.plans]  # fmt: skip
        nothing_stored = not hits and prefix == 0
        why = None
        if p is None and floor.name != EXACT_FLOOR.name and not nothing_stored:
            why = f"no plan predictor for model {m.model_id}"
        return [estimate(s, p) for s in signals], why

    def _exact_only(self) -> list[Estimate]:
        """Estimates of the always-exact plans, with nothing known of the store but that the
        turn cannot be predicted: every one costs a full prefill's compute."""
        return [Estimate(n, True, 1.0, 0.0, 0.0) for n in self.plans if CANDIDATES[n].always_exact]

    def _prefix_tokens(self, ctx: ReuseContext, prompt: TokenizedPrompt, held: StoreProbe) -> int:
        """The tokens `prefix` would reuse: its leading stored blocks, less the last token."""
        page = ctx.pool.config.page_size
        blocks = 0
        for cid in block_chain(prompt.ids, page, chain_scope(prompt)):
            if not held(cid):
                break
            blocks += 1
        return max(0, min(blocks * page, prompt.num_tokens - 1))

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        if PREFIX in self.plans:
            cast(PrefixReuse, self.strategies[PREFIX]).commit(ctx, prompt, seq, positions)
        if any(n != PREFIX and n != "full" for n in self.plans):
            commit_segments(ctx, prompt, seq, positions)
            self.history.record(prompt, positions)


def estimate(s: PlanSignals, p: Predictor | None) -> Estimate:
    """Predicted cost (the plan's work over full's) and KL of one plan; without a predictor,
    no KL (only its exactness can be used)."""
    cost = s.work
    if p is None:
        return Estimate(s.plan, s.exact, cost, 0.0 if s.exact else 1.0,
                        0.0 if s.exact else 1.0)  # fmt: skip
    fit = p.plans.get(s.plan)
    if s.exact:
        return Estimate(s.plan, True, cost, 0.0, 0.0)
    if fit is None:  # a plan the predictor was not fitted for: never chosen unless exact
        return Estimate(s.plan, False, cost, float("inf"), float("inf"))
    return Estimate(s.plan, False, cost, fit.first.predict(s), fit.tf.predict(s))
