from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.decode.policies import DECODE_POLICIES
from agentcache.decode.profile import HeadProfile, save_profile
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind


def _streams(policy: str) -> bool:
    """Whether `policy`'s plan gives some head a window of pages (it never sees the rest)."""
    p = DECODE_POLICIES.get(policy)()
    prof = HeadProfile("m#1", 2, 2, [[0.1, 0.9], [0.5, 0.7]], [(0, 0)])
    return p.plan(2, 2, prof if p.needs_profile else None).streaming is not None


# every registered sparse policy; those that select pages by score (every page with a budget
# over all of them, so dense decode's output) apart from those that stream a window
SPARSE_POLICIES = [n for n in DECODE_POLICIES.names() if n != "dense"]
TOP_K_POLICIES = [n for n in SPARSE_POLICIES if not _streams(n)]

TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 24


def make_profile(model: LoadedModel, model_id: str | None = None) -> HeadProfile:
    c = model.config
    stability = [
        [((3 * layer + head) % 7) / 7 for head in range(c.num_kv_heads)]
        for layer in range(c.num_layers)
    ]
    unstable = [(0, 1), (2, 0)]
    model_id = model_id or model.model_id
    return HeadProfile(model_id, c.num_layers, c.num_kv_heads, stability, unstable)


@pytest.fixture
def profile_file(tiny: LoadedModel, tmp_path: Path) -> Path:
    return save_profile(make_profile(tiny), tmp_path / "profile.json")


@pytest.fixture
def long_prompt() -> SegmentedPrompt:
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, TEXT)])
