"""What each tiny family variant declares it cannot do (`ModelFamily.limits`), read once: the
family suites run a test where the family serves its feature and a refusal test where it
declares it does not, so no skip list is kept by hand."""

from __future__ import annotations

from functools import cache

from agentcache.decode.policies import DECODE_POLICIES
from agentcache.model.families.base import POSITION_KEEPING_STRATEGIES
from agentcache.model.loading import LoadedModel
from agentcache.reuse import STRATEGIES
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_model

VARIANTS = list(TINY_FAMILY_CONFIGS)
SPARSE_POLICIES = [n for n in DECODE_POLICIES.names() if n != "dense"]
KEY_MOVING_STRATEGIES = [n for n in STRATEGIES.names() if n not in POSITION_KEEPING_STRATEGIES]


@cache
def model(variant: str, seed: int = 0) -> LoadedModel:
    return tiny_family_model(variant, seed)


def limits(variant: str) -> dict[str, str]:
    """The features `variant` declares beyond it -> why."""
    return model(variant).forward.limits()


def serving(feature: str) -> list[str]:
    """The variants that declare no limit on `feature`."""
    return [v for v in VARIANTS if feature not in limits(v)]


def refusing(feature: str) -> list[str]:
    """The variants that declare `feature` beyond them."""
    return [v for v in VARIANTS if feature in limits(v)]
