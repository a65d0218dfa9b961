"""The planner's rule, apart from any model: the cheapest plan whose predicted fidelity
meets the floor.

    floor   exact            : only plans exact on this turn
            high | balanced  : predicted first-token KL <= bound.first and TF KL <= bound.tf
            kl=x             : both predictions <= x
    cost    the plan's work over full's (as the cost guard counts it); an approximate plan
            must beat the cheapest exact one by `min_gain` (the planner's own estimate is
            not free of error: a saving smaller than that is not worth the fidelity)
"""

from __future__ import annotations

from dataclasses import dataclass

from agentcache.errors import ConfigError

FIDELITIES = ("exact", "high", "balanced")
MAX_KL = 1.0  # nats; past it a bound admits plans whose output has nothing to do with full's


@dataclass(frozen=True)
class Floor:
    name: str  # "exact", "high", "balanced" or "kl=<x>"
    first: float  # bound on predicted first-token KL (0: exact plans only)
    tf: float  # bound on predicted teacher-forced KL

    @property
    def exact_only(self) -> bool:
        return self.first == 0.0 and self.tf == 0.0


EXACT_FLOOR = Floor("exact", 0.0, 0.0)


def check_fidelity(fidelity: str, kl: float) -> None:
    if fidelity not in FIDELITIES:
        raise ConfigError(f"fidelity must be one of {', '.join(FIDELITIES)}; got {fidelity!r}")
    if kl != 0.0 and not 0.0 < kl <= MAX_KL:
        raise ConfigError(f"kl must be in (0, {MAX_KL:g}] nats (0: use fidelity), got {kl:g}")


@dataclass(frozen=True)
class Estimate:
    plan: str
    exact: bool  # exact on this turn: output equal to full recompute's
    cost: float  # the plan's work over full's (the cost guard's units)
    first_kl: float  # predicted (0 when exact)
    tf_kl: float

    def meets(self, floor: Floor) -> bool:
        if self.exact:
            return True
        return not floor.exact_only and self.first_kl <= floor.first and self.tf_kl <= floor.tf


def choose(estimates: list[Estimate], floor: Floor, min_gain: float) -> Estimate:
    """The cheapest estimate meeting `floor`; an approximate one only when it is cheaper than
    the cheapest exact one by more than `min_gain`. Ties go to the exact plan, then to the
    earlier estimate."""
    exact = [e for e in estimates if e.exact]
    if not exact:
        raise ValueError("no exact plan among the estimates")
    best_exact = min(exact, key=lambda e: e.cost)
    approx = [e for e in estimates if not e.exact and e.meets(floor)]
    if not approx:
        return best_exact
    best = min(approx, key=lambda e: e.cost)
    return best if best.cost < best_exact.cost - min_gain else best_exact
