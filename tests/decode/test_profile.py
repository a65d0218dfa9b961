"""RCO arithmetic, profile files, and what the engine does with a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig
from agentcache.decode.profile import (
    load_profile,
    profile_filename,
    rco,
    save_profile,
    unstable_set,
    window_rco,
)
from agentcache.errors import ProfileError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from tests.decode.conftest import make_profile


def test_rco_identical_sets_is_one_and_disjoint_is_zero() -> None:
    a = torch.tensor([1, 2, 3, 4])
    assert float(rco(a, a.flip(0), 16)) == 1.0
    assert float(rco(a, torch.tensor([5, 6, 7, 8]), 16)) == 0.0


def test_rco_corrects_for_chance_overlap() -> None:
    a, b = torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 7, 8])
    # overlap 0.5, random 4/8 = 0.5 -> no better than chance; with 16 pages chance is 0.25
    assert float(rco(a, b, 8)) == 0.0
    assert float(rco(a, b, 16)) == pytest.approx((0.5 - 0.25) / 0.75)


def test_rco_needs_fewer_top_pages_than_candidates() -> None:
    with pytest.raises(ValueError, match="K < N"):
        rco(torch.tensor([1, 2]), torch.tensor([1, 2]), 2)


def test_window_rco_compares_each_step_with_its_window_start() -> None:
    # one head; steps 0..3 with window 2: pairs (0,1) and (2,3)
    sets = torch.tensor([[1, 2], [1, 2], [3, 4], [5, 6]]).view(4, 1, 2)
    got = window_rco(sets, [10, 10, 10, 10], window=2)
    assert got.shape == (1,) and float(got[0]) == pytest.approx(0.5)


def test_unstable_set_is_the_least_stable_fraction() -> None:
    s = torch.tensor([[0.9, 0.1], [0.5, 0.05]])
    assert unstable_set(s, 0.5) == [(1, 1), (0, 1)]
    assert unstable_set(s, 0.0) == []
    with pytest.raises(ValueError):
        unstable_set(s, 1.5)


def test_profile_round_trip(tiny: LoadedModel, tmp_path: Path) -> None:
    prof = make_profile(tiny)
    path = save_profile(prof, tmp_path / profile_filename(tiny.model_id))
    assert "#" not in path.name
    assert load_profile(path, tiny.model_id, 4, 2) == prof


def test_profile_for_another_model_names_both_ids(tiny: LoadedModel, tmp_path: Path) -> None:
    path = save_profile(make_profile(tiny, "other-model#abc"), tmp_path / "p.json")
    with pytest.raises(ProfileError) as e:
        load_profile(path, tiny.model_id, 4, 2)
    assert "other-model#abc" in str(e.value) and tiny.model_id in str(e.value)


@pytest.mark.parametrize(
    "text", ["{not json", '{"format": "x"}', "[]", '{"format": "agentcache-head-profile/1"}']
)
def test_corrupted_profile_is_a_clear_error(tiny: LoadedModel, tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=r"corrupted.*" + tiny.model_id.split("#")[0]):
        load_profile(path, tiny.model_id, 4, 2)


def test_profile_of_wrong_shape_is_corrupted(tiny: LoadedModel, tmp_path: Path) -> None:
    prof = make_profile(tiny)
    path = save_profile(prof, tmp_path / "p.json")
    path.write_text(path.read_text().replace('"num_layers": 4', '"num_layers": 3'))
    with pytest.raises(ProfileError, match="corrupted"):
        load_profile(path, tiny.model_id, 4, 2)


def test_missing_profile_names_the_model_and_the_command(tiny: LoadedModel, tmp_path: Path) -> None:
    config = DecodeConfig("flexicache", profile_dir=tmp_path)
    with pytest.raises(ProfileError, match="profile-heads") as e:
        Engine(tiny, EngineConfig(kv_pages=64, decode=config))
    assert tiny.model_id in str(e.value)


def test_engine_finds_the_profile_by_model_id(tiny: LoadedModel, tmp_path: Path) -> None:
    save_profile(make_profile(tiny), tmp_path / profile_filename(tiny.model_id))
    config = DecodeConfig("flexicache", profile_dir=tmp_path)
    e = Engine(tiny, EngineConfig(kv_pages=64, decode=config))
    assert e.decode.policy == "flexicache" and e.decode.fallback_reason is None


def test_dense_fallback_only_when_asked_and_counted(
    tiny: LoadedModel, tmp_path: Path, long_prompt: SegmentedPrompt
) -> None:
    path = save_profile(make_profile(tiny, "other#1"), tmp_path / "p.json")
    with pytest.raises(ProfileError):
        Engine(tiny, EngineConfig(kv_pages=256, decode=DecodeConfig("flexicache", profile=path)))
    config = DecodeConfig("flexicache", profile=path, dense_fallback=True)
    with pytest.warns(UserWarning, match="decoding densely"):
        e = Engine(tiny, EngineConfig(strategy="full", kv_pages=256, decode=config))
    g = e.generate(long_prompt, GenerationParams(max_new_tokens=4), commit=False)
    assert g.stats.decode_policy == "dense" and g.stats.decode_fallbacks == 1
    assert g.stats.decode is None
    assert "other#1" in (e.decode.fallback_reason or "")
    assert g.stats.decode_fallback_reason == e.decode.fallback_reason
    assert g.stats.decode_fallback_kind == "profile"
