"""bench-decode end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcache.bench.decode.bench import DecodeBenchSettings, run_decode_bench
from agentcache.bench.decode.report import write_report
from agentcache.decode.config import DecodeConfig, parse_policy_spec
from agentcache.decode.profile import save_profile
from agentcache.decode.setup import DecodeSetup
from agentcache.heads.prompts import token_prompts
from agentcache.model.loading import LoadedModel
from tests.decode.conftest import TEXT, make_profile

KEYS = (
    "fast_tier_kv_bytes",
    "fast_tier_kv_ratio_vs_dense",
    "decode_tokens_per_s",
    "decode_speed_ratio_vs_dense",
    "greedy_agreement_with_dense",
    "bytes_promoted_per_rerank",
)


def test_bench_decode_writes_every_metric(tiny: LoadedModel, tmp_path: Path) -> None:
    profile_file = save_profile(make_profile(tiny), tmp_path / "profile.json")
    settings = DecodeBenchSettings(
        context=600,
        new_tokens=40,
        policies=("dense", "quest", "flexicache", "flexicache:verify=4"),
        budget_pages=4,
        needle_tokens=6,
        needle_prompts=2,
    )
    prompts = token_prompts(tiny, [TEXT], settings.prompt_tokens, 1)
    assert prompts[0].num_tokens == 560

    setups = {
        spec: DecodeSetup.resolve(
            tiny, DecodeConfig.from_spec(spec, budget_pages=4, profile=profile_file)
        )
        for spec in settings.policies
    }
    results = run_decode_bench(tiny, prompts, settings, setups)
    results.update(
        model=tiny.model_id, command="test", num_prompts=1,
        settings={"context": 600, "new_tokens": 40, "prompt_tokens": 560, "budget_pages": 4,
                  "gqa_combine": "sum"},
        machine={"cores": 1, "torch_threads": 1},
    )  # fmt: skip
    write_report(tmp_path, results)
    pol = json.loads((tmp_path / "results.json").read_text())["policies"]
    assert set(pol) == {"dense", "quest", "flexicache", "flexicache:verify=4"}
    for name in pol:
        assert all(k in pol[name] for k in KEYS), name
    dense, flexi = pol["dense"], pol["flexicache"]
    assert dense["fast_tier_kv_ratio_vs_dense"] == 1.0 and dense["greedy_agreement_with_dense"] == 1
    assert pol["quest"]["fast_tier_kv_ratio_vs_dense"] == pytest.approx(1.0)
    # 6 of 8 heads offloaded with 1 + 4 + 2 + 1 slots of 38 pages
    expected = (2 * 38 + 6 * 8) / (8 * 38)
    assert flexi["fast_tier_kv_ratio_vs_dense"] == pytest.approx(expected)
    assert flexi["bytes_promoted_per_rerank"] > 0 and dense["bytes_promoted_per_rerank"] == 0
    assert 0 <= flexi["greedy_agreement_with_dense"] <= 1
    assert flexi["head_reranks_per_step"] < pol["quest"]["head_reranks_per_step"] == 8
    assert pol["quest"]["top_pages_per_rerank"] == 4  # fixed top-K: the whole budget
    verified = pol["flexicache:verify=4"]
    assert verified["greedy_agreement_with_dense"] == 1.0  # dense's tokens, by construction
    assert 0 <= verified["verify_acceptance"] <= 1 and verified["verify_passes_per_token"] > 0
    assert "verify_acceptance" not in flexi
    report = (tmp_path / "report.md").read_text()
    assert "| flexicache |" in report and "Planted needle" in report
    needle = json.loads((tmp_path / "results.json").read_text())["needle"]["policies"]
    assert needle["dense"]["same_as_dense"] and set(needle) == set(pol)
    assert all(isinstance(pol[n]["needle_found"], bool) for n in pol)
    assert (tmp_path / "decode.png").stat().st_size > 0
    per_prompt = json.loads((tmp_path / "results.json").read_text())["per_prompt"]
    assert [p["kind"] for p in per_prompt] == ["text", "needle", "needle"]
    assert all("needle_found" in p["policies"]["quest"] for p in per_prompt[1:])
    assert dense["speed_ratio_median"] == 1.0 and dense["prompts_identical_to_dense"] == 3
    assert verified["prompts_identical_to_dense"] == 3
    assert flexi["speed_ratio_min"] <= flexi["speed_ratio_median"] <= flexi["speed_ratio_max"]
    # a decoder's set-up counts against it: with it, no policy gains on dense
    assert flexi["speed_with_setup_ratio_median"] <= flexi["speed_ratio_median"]
    assert dense["speed_with_setup_ratio_median"] == 1.0
    assert flexi["teacher_forced_top1_min"] <= flexi["teacher_forced_top1_agreement"]
    assert flexi["needle_prompts_found"] in {"0/2", "1/2", "2/2"}


def test_bench_settings_need_dense_and_room_for_new_tokens() -> None:
    with pytest.raises(ValueError, match="dense"):
        DecodeBenchSettings(policies=("flexicache",))
    with pytest.raises(ValueError, match="context"):
        DecodeBenchSettings(context=100, new_tokens=100)


def test_policy_specs_carry_options_and_reject_unknown_ones() -> None:
    assert parse_policy_spec("flexicache:verify=8:budget=96") == (
        "flexicache",
        {"verify": 8, "budget_pages": 96},
    )
    assert parse_policy_spec("dense") == ("dense", {})
    assert DecodeConfig.from_spec("quest:budget=96", budget_pages=4, verify=2) == DecodeConfig(
        "quest", budget_pages=96, verify=2
    )
    with pytest.raises(ValueError, match="keys: verify, budget, recent"):
        parse_policy_spec("flexicache:speed=3")
    with pytest.raises(ValueError, match="not an integer"):
        parse_policy_spec("flexicache:verify=x")
