"""profile-heads' run on the tiny model: the engine's prefill, then the decode trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.decode.profiler import ProfileSettings
from agentcache.heads.prompts import token_prompts
from agentcache.heads.run import plot_profile, profile_heads
from agentcache.model.loading import LoadedModel
from tests.decode.conftest import TEXT


def test_profiler_scores_every_head_and_measures_both_gqa_combines(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    prompts = token_prompts(tiny, [TEXT], 400, 2)
    steps = []
    settings = ProfileSettings(budget_pages=8, steps=34, unstable_fraction=0.25)
    prof = profile_heads(tiny, prompts, settings, lambda: steps.append(1))
    assert len(steps) == 68
    s = prof.stability_tensor()
    assert s.shape == (4, 2) and bool(((s >= 0) & (s <= 1)).all())
    assert len(prof.unstable) == 2
    least = sorted(s.flatten().tolist())[:2]
    assert sorted(float(s[la, h]) for la, h in prof.unstable) == least
    assert set(prof.rco_by_window) == {"4", "64"} and set(prof.gqa_recall) == {"sum", "max"}
    assert all(0 < r <= 1 for r in prof.gqa_recall.values())
    assert prof.settings["budget_pages"] == 8 and prof.settings["prompts"] == 2
    plot_profile(prof, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


def test_profiler_rejects_prompts_too_short_for_the_budget(tiny: LoadedModel) -> None:
    prompts = token_prompts(tiny, [TEXT], 100, 1)
    with pytest.raises(ValueError, match="more than 66 pages"):
        profile_heads(tiny, prompts, ProfileSettings(budget_pages=64, steps=4))
