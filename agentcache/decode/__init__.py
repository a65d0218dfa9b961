"""FlexiCache decode: MinMax page metadata, per-head top-K sparse decode, head-stability (RCO)
profiles, and placement/rerank policies chosen by name (see docs/decode.md)."""

from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import DecodeStats, SparseDecoder
from agentcache.decode.policies import DECODE_POLICIES, DecodePolicy, HeadPlan

__all__ = [
    "DECODE_POLICIES",
    "DecodeConfig",
    "DecodePolicy",
    "DecodeStats",
    "HeadPlan",
    "SparseDecoder",
]
