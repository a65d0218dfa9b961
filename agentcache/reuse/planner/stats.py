"""What a planned prefill reports: the chosen plan's own stats, plus why it was chosen."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from agentcache.reuse.base import ReuseStats
from agentcache.reuse.planner.choice import Estimate


@dataclass(frozen=True)
class PlanReport:
    plan: str  # the plan run
    floor: str  # the floor it was chosen for ("exact", "high", "balanced", "kl=<x>")
    chosen: Estimate  # its predicted cost and KL
    considered: tuple[Estimate, ...]  # every plan estimated this turn
    planning_s: float  # the planner's own time: metadata reads, estimates, the choice
    unpredicted: str | None = None  # why the predictor could not run (the turn ran exact)


@dataclass
class PlannedStats(ReuseStats):
    plan: PlanReport | None = None

    @classmethod
    def of(cls, inner: ReuseStats, report: PlanReport, started: float) -> PlannedStats:
        """`inner`'s figures, timed from `started` (planning included in the overhead)."""
        values = {f.name: getattr(inner, f.name) for f in fields(ReuseStats) if f.init}
        stats = cls(**(values | {"started": started}), plan=report)
        stats.close()
        return stats


def plan_fields(stats: ReuseStats) -> dict[str, Any]:
    """A bench record's planner fields (none for other strategies)."""
    if not isinstance(stats, PlannedStats) or stats.plan is None:
        return {}
    r = stats.plan
    return {
        "plan": r.plan,
        "plan_floor": r.floor,
        "plan_exact": r.chosen.exact,
        "predicted_cost": r.chosen.cost,
        "predicted_kl_first_token": r.chosen.first_kl,
        "predicted_tf_kl": r.chosen.tf_kl,
        "planning_ms": r.planning_s * 1e3,
        "plan_unpredicted": r.unpredicted,
        "plans_considered": {
            e.plan: {"cost": e.cost, "first_kl": e.first_kl, "tf_kl": e.tf_kl, "exact": e.exact}
            for e in r.considered
        },
    }
