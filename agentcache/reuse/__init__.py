"""Reuse strategies: how a prompt's KV is assembled from the store and fresh compute."""

from agentcache.reuse.base import STRATEGIES, PrefillResult, ReuseContext, ReuseStats, ReuseStrategy
from agentcache.reuse import full, prefix  # noqa: F401  (registers the strategies)

__all__ = ["STRATEGIES", "PrefillResult", "ReuseContext", "ReuseStats", "ReuseStrategy"]
