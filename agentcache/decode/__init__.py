"""FlexiCache decode: MinMax page metadata, per-head top-K sparse decode, head-stability (RCO)
profiles, and placement/rerank policies chosen by name (see docs/decode.md)."""

from agentcache.decode.base import Decoder
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.policies import DECODE_POLICIES, DecodePolicy, HeadPlan
from agentcache.decode.stats import DecodeStats

__all__ = [
    "DECODE_POLICIES",
    "DecodeConfig",
    "DecodePolicy",
    "DecodeStats",
    "Decoder",
    "HeadPlan",
    "SparseDecoder",
]
