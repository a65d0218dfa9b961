"""Reuse strategies: how a prompt's KV is assembled from the store and fresh compute."""

from agentcache.reuse import (  # noqa: F401  (registers)
    full,
    planner,
    prefix,
    promptcache,
    strategies,
)
from agentcache.reuse.base import STRATEGIES, PrefillResult, ReuseContext, ReuseStats, ReuseStrategy
from agentcache.reuse.spec import DEFAULT_STRATEGY, StrategySpec

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "PrefillResult",
    "ReuseContext",
    "ReuseStats",
    "ReuseStrategy",
    "StrategySpec",
]
