"""Token rankers: registered policies that order reused tokens for recompute (base.py has the
contract). To add one: implement `TokenRanker` in a module here and register it with
`@RANKERS.register("<name>")`; import the module below."""

from agentcache.reuse.ranking import (  # noqa: F401  (registers)
    attention,
    deviation,
    offset,
    query,
    random,
    weighted,
)
from agentcache.reuse.ranking.base import RANKERS, RankerConfig, RankingView, TokenRanker

__all__ = ["RANKERS", "RankerConfig", "RankingView", "TokenRanker"]
