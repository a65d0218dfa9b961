"""The decode suites' `tiny`, once per family variant that serves sparse decode (derived from
what each family declares; those that declare it beyond them are refused at configuration:
tests/families/test_refusals.py)."""

from __future__ import annotations

import pytest

from agentcache.model.families.base import SPARSE_DECODE
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from tests.decode.conftest import TEXT, profile_file  # noqa: F401  (fixtures)
from tests.families.declared import model, serving

SPARSE_VARIANTS = serving(SPARSE_DECODE)


@pytest.fixture(scope="package", params=SPARSE_VARIANTS)
def tiny(request: pytest.FixtureRequest) -> LoadedModel:
    return model(request.param, seed=13)


@pytest.fixture
def long_prompt() -> SegmentedPrompt:
    """Long enough for several pages, short of the tiny configs' 512 positions."""
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, TEXT[: len(TEXT) // 4])])
