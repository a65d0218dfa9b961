"""The plans a turn may take, each an existing strategy run through its public interface,
and what each would do on this turn, known before any layer runs (`PlanSignals`).

| plan   | runs                                     | exact | what it leaves to the cache        |
|--------|------------------------------------------|-------|------------------------------------|
| exact  | pic, every changed-context token computed| yes   | segments whose context is unchanged|
| prefix | prefix (16-token blocks)                 | yes   | the longest unchanged token prefix |
| full   | full                                     | yes   | nothing                            |
| epic   | epic, exact segments kept                | no    | all but the first 64 of each chunk |
| pic    | pic                                      | no    | every reused token                 |
| probe  | rpdc without cover (0.2 per computed)    | no    | reused tokens the probe ranks low  |
| probe5 | rpdc:extra=0.5                           | no    | ... at 0.5 per computed token      |

A non-exact plan becomes exact on a turn where it leaves no changed-context token out.

A plan's cost (`PlanSignals.work`) is the work it would do as a share of `full`'s, in the
units of the cost guard (`reuse/guard.py`, from the model's shapes): token-layers through the
projections and MLP, attention pairs (a token late in the prompt attends more), loads, and a
probe pass where one runs (`reuse/plan_cost.py`), the figures every strategy's guard reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import ReuseStrategy
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.guard import CostModel, PlanCost, computed_cost, full_cost, loaded
from agentcache.reuse.plan_cost import selective_cost
from agentcache.reuse.runs import StoredHit, reused_runs
from agentcache.reuse.selective import SelectiveRecompute
from agentcache.reuse.spec import StrategySpec
from agentcache.reuse.upfront import UpFrontSelection, select_up_front

FULL, PREFIX, EXACT = "full", "prefix", "exact"


@dataclass(frozen=True)
class Candidate:
    name: str
    spec: str  # the strategy it runs
    always_exact: bool = False

    def build(self) -> ReuseStrategy:
        return StrategySpec.parse(self.spec).build()


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        # exact plans first: at equal cost the earlier wins, and `exact` reports misses
        Candidate(EXACT, "pic:exact_prefix=true:selection=offset:ratio=1", always_exact=True),
        Candidate(PREFIX, "prefix", always_exact=True),
        Candidate(FULL, "full", always_exact=True),
        Candidate("epic", "epic:exact_prefix=true"),
        Candidate("pic", "pic"),
        Candidate("probe", "rpdc:cover=0"),
        Candidate("probe5", "rpdc:extra=0.5"),
    )
}
DEFAULT_PLANS = tuple(CANDIDATES)


def check_plans(names: tuple[str, ...]) -> tuple[str, ...]:
    """Registered plan names, an exact one among them (a turn that cannot be predicted, or
    an exact floor, needs one)."""
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ConfigError(f"unknown plans {unknown}; known: {sorted(CANDIDATES)}")
    if not names:
        raise ConfigError("plans: name at least one plan")
    if not any(CANDIDATES[n].always_exact for n in names):
        raise ConfigError(f"plans {list(names)} hold no exact plan (full, prefix or exact)")
    return names


@dataclass(frozen=True)
class PlanSignals:
    """What a plan would do on this turn, from where reused tokens sit and where their
    stored copies were computed (no KV, no model call)."""

    plan: str
    prompt_tokens: int
    computed: int  # tokens computed through every layer
    loaded: int  # reused tokens loaded from the store
    changed: int  # reused tokens whose context or position changed since they were stored
    left: int  # of them, the tokens the plan leaves uncomputed
    shift: float  # mean |position shift| of the changed tokens
    probe: bool  # a probe pass runs (and ranks)
    work: float  # the plan's work over full's on this turn, in the cost guard's units
    # where the changed tokens the plan may leave out sit: the prompt tokens after the last
    # of them (0 when none), and the tokens before it that no stored copy supplies (new or
    # edited text: how much of their context is new)
    reach: int = 0
    fresh: int = 0
    # read from the model (planner/attention.py), None when not read: the attention mass the
    # prompt's last tokens pay the tokens the plan leaves out, in a fresh pass over the first
    # layers; and that mass weighted by each token's key deviation from its stored copy
    attn: float | None = None
    dev: float | None = None

    @property
    def exact(self) -> bool:
        return self.left == 0

    @property
    def compute_fraction(self) -> float:
        return self.computed / max(1, self.prompt_tokens)

    @property
    def loaded_fraction(self) -> float:
        return self.loaded / max(1, self.prompt_tokens)


def plan_signals(
    c: Candidate, strategy: ReuseStrategy, prompt: TokenizedPrompt, hits: list[StoredHit],
    prefix_tokens: int, costs: CostModel,
) -> PlanSignals:  # fmt: skip
    """`prefix_tokens`: the tokens `prefix` would reuse (its matching blocks); `costs` the
    model's cost weights (`CostModel.of(config)`)."""
    t = prompt.num_tokens
    if c.name == FULL:
        return PlanSignals(c.name, t, t, 0, 0, 0, 0.0, False, 1.0)
    if c.name == PREFIX:
        cost = computed_cost(torch.arange(prefix_tokens, t), t, costs.num_layers)
        work = _share(cost + loaded(prefix_tokens), t, costs)
        return PlanSignals(c.name, t, t - prefix_tokens, prefix_tokens, 0, 0, 0.0, False, work)
    return _selective(c.name, cast(SelectiveRecompute, strategy), prompt, hits, costs)


def _share(cost: PlanCost, num_tokens: int, costs: CostModel) -> float:
    """A plan's cost over `full`'s on a prompt of `num_tokens`."""
    return cost.units(costs) / max(full_cost(num_tokens, costs.num_layers).units(costs), 1e-9)


@dataclass(frozen=True)
class LeftOut:
    """Where a plan's changed tokens stay uncomputed, as (T,) masks: `surely` are left
    whatever a probe ranks; of `ranked`, a probe pass picks `budget` (the rest are left)."""

    surely: Tensor
    ranked: Tensor
    budget: int

    def given(self, scores: Tensor) -> Tensor:
        """(T,) the tokens left when the probe picks the top `budget` of `ranked` by `scores`
        (T,); ties go to the earlier token."""
        pool = self.ranked.nonzero().flatten()
        left = self.surely.clone()
        if len(pool) > self.budget:
            order = torch.sort(scores[pool], descending=True, stable=True).indices
            left[pool[order[self.budget :]]] = True
        return left


def left_out(c: Candidate, strategy: ReuseStrategy, prompt: TokenizedPrompt,
             hits: list[StoredHit]) -> LeftOut:  # fmt: skip
    """Which changed tokens plan `c` leaves uncomputed on this turn (none for the always-exact
    plans)."""
    t = prompt.num_tokens
    if c.always_exact and c.name != EXACT:
        none = torch.zeros(t, dtype=torch.bool)
        return LeftOut(none, none, 0)
    sel, changed, ranks = _selection(cast(SelectiveRecompute, strategy).options, prompt, hits)
    if not ranks:
        return LeftOut(changed & ~sel.base, torch.zeros_like(changed), 0)
    pool = sel.candidates & ~sel.base
    return LeftOut(changed & ~(sel.base | pool), changed & pool, min(int(pool.sum()), sel.budget))


def _selection(
    o: SelectiveOptions, prompt: TokenizedPrompt, hits: list[StoredHit]
) -> tuple[UpFrontSelection, Tensor, bool]:
    """The up-front selection, the reused tokens whose context or position changed, and
    whether a probe pass ranks (False when it would pick the whole pool)."""
    t = prompt.num_tokens
    natural = torch.arange(t)
    sel = select_up_front(o, t, reused_runs(prompt, hits, natural, o))
    truly = reused_runs(prompt, hits, natural, replace(o, exact_prefix=True))
    changed = sel.reused & ~select_up_front(replace(o, exact_prefix=True), t, truly).exact
    pool = sel.candidates & ~sel.base
    ranks = o.evidence_pass is not None and bool(pool.any())
    if ranks and min(int(pool.sum()), sel.budget) >= int(pool.sum()) and o.probe_shortcut:
        ranks = False
        sel = replace(sel, base=sel.base | pool)
    return sel, changed, ranks


def _selective(
    name: str, s: SelectiveRecompute, prompt: TokenizedPrompt, hits: list[StoredHit],
    costs: CostModel,
) -> PlanSignals:  # fmt: skip
    t = prompt.num_tokens
    sel, changed, probe = _selection(s.options, prompt, hits)
    shift = _shift(hits, changed)
    # what the strategy's guard counts: tokens computed up front (none when a pass ranks) and
    # the reused tokens loaded (those computed up front are not, as the strategy skips them)
    computed = None if probe else sel.base
    num_loaded = int((sel.reused if computed is None else sel.reused & ~computed).sum())
    work = _share(selective_cost(s.options, sel, computed, num_loaded, costs.num_layers), t, costs)
    if probe:  # the probe picks `budget` of the pool: left are the changed it cannot reach
        pool = sel.candidates & ~sel.base
        budget = min(int(pool.sum()), sel.budget)
        reach, fresh = _where(changed & ~sel.base, sel.reused)
        left = max(0, int((changed & ~sel.base).sum()) - budget)
        return PlanSignals(name, t, int(sel.base.sum()) + budget, int(sel.reused.sum()),
                           int(changed.sum()), left, shift, True, work, reach, fresh)  # fmt: skip
    left_mask = changed & ~sel.base
    reach, fresh = _where(left_mask, sel.reused)
    return PlanSignals(name, t, int(sel.base.sum()), int(sel.reused.sum()), int(changed.sum()),
                       int(left_mask.sum()), shift, False, work, reach, fresh)  # fmt: skip


def _where(left: Tensor, reused: Tensor) -> tuple[int, int]:
    """(`reach`, `fresh`) of a (T,) mask of tokens a plan may leave out."""
    idx = left.nonzero().flatten()
    if idx.numel() == 0:
        return 0, 0
    last = int(idx[-1])
    return left.numel() - 1 - last, int((~reused[:last]).sum())


def _shift(hits: list[StoredHit], changed: Tensor) -> float:
    """Mean |new position - stored position| over the changed tokens (0 when none)."""
    total, n = 0.0, 0
    for h in hits:
        old = h.stored_positions
        mask = changed[h.start : h.start + h.num_tokens]
        if old is None or not bool(mask.any()):
            continue
        new = torch.arange(h.start, h.start + h.num_tokens)
        total += float((new - old[: h.num_tokens]).abs()[mask].sum())
        n += int(mask.sum())
    return total / n if n else 0.0
