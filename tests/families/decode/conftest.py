"""The decode suites' `tiny`, once per family that serves sparse decode (those with a sliding
window refuse it at configuration: tests/decode/test_families.py)."""

from __future__ import annotations

import pytest

from agentcache.model.families.base import SPARSE_DECODE
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_model
from tests.decode.conftest import TEXT, profile_file  # noqa: F401  (fixtures)

SPARSE_VARIANTS = [
    v for v in TINY_FAMILY_CONFIGS if SPARSE_DECODE not in tiny_family_model(v).forward.limits()
]


@pytest.fixture(scope="package", params=SPARSE_VARIANTS)
def tiny(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family_model(request.param, seed=13)


@pytest.fixture
def long_prompt() -> SegmentedPrompt:
    """Long enough for several pages, short of the tiny configs' 512 positions."""
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, TEXT[: len(TEXT) // 4])])
