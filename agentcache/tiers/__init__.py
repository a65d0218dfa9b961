"""Fast / host / disk tiers behind one interface, and the store that places pages in them."""

from agentcache.tiers.base import PageData, PageKey, Tier, TierCapacityError, TierError
from agentcache.tiers.config import TierConfig
from agentcache.tiers.disk import DiskTier
from agentcache.tiers.memory import MemoryTier
from agentcache.tiers.store import TieredSegmentStore

__all__ = [
    "DiskTier",
    "MemoryTier",
    "PageData",
    "PageKey",
    "Tier",
    "TierCapacityError",
    "TierConfig",
    "TierError",
    "TieredSegmentStore",
]
