"""The per-turn reuse planner: a fidelity predictor and the cheapest plan that meets a floor."""

from agentcache.reuse.planner.choice import FIDELITIES, Estimate, Floor, choose
from agentcache.reuse.planner.predictor import Predictor, load_predictor
from agentcache.reuse.planner.stats import PlannedStats, PlanReport, plan_fields
from agentcache.reuse.planner.strategy import DEFAULT_FIDELITY, PlannedReuse

__all__ = [
    "DEFAULT_FIDELITY",
    "FIDELITIES",
    "Estimate",
    "Floor",
    "PlanReport",
    "PlannedReuse",
    "PlannedStats",
    "Predictor",
    "choose",
    "load_predictor",
    "plan_fields",
]
