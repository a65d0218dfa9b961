"""Reuse strategies: how a prompt's KV is assembled from the store and fresh compute."""

from agentcache.reuse import full, prefix, promptcache, strategies  # noqa: F401  (registers)
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
