"""Sparse decode on the real default model (slow: loads SmolLM2-135M)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from agentcache.bench.decode.bench import DecodeBenchSettings, run_decode_bench
from agentcache.decode.config import DecodeConfig
from agentcache.decode.setup import DecodeSetup
from agentcache.heads.prompts import load_texts, token_prompts


@pytest.mark.slow
def test_full_budget_sparse_decode_matches_dense_on_the_default_model() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentcache.model.loading import load_model

    model = load_model(None)
    settings = DecodeBenchSettings(
        context=1040, new_tokens=16, policies=("dense", "quest"), budget_pages=10_000,
        teacher_forced=False,
    )  # fmt: skip
    workload = Path(__file__).parents[2] / "benchmarks" / "workloads" / "memgpt.jsonl"
    prompts = token_prompts(model, load_texts(workload), settings.prompt_tokens, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        setups = {p: DecodeSetup.resolve(model, DecodeConfig(p, 10_000)) for p in settings.policies}
        results = run_decode_bench(model, prompts, settings, setups)
    quest = results["per_prompt"][0]["policies"]["quest"]
    assert quest["greedy_agreement_with_dense"] == 1.0
    assert quest["decode"]["budget_clamped"]


@pytest.mark.slow
def test_verified_small_budget_decode_is_dense_decode_on_the_default_model() -> None:
    """quest with 4 pages of 130 leaves dense's path; verified drafts of the same decoder
    reproduce dense's tokens."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from agentcache.model.loading import load_model

    model = load_model(None)
    settings = DecodeBenchSettings(
        context=2080, new_tokens=32, policies=("dense", "quest", "quest:verify=8"),
        budget_pages=4, teacher_forced=False,
    )  # fmt: skip
    workload = Path(__file__).parents[2] / "benchmarks" / "workloads" / "memgpt.jsonl"
    prompts = token_prompts(model, load_texts(workload), settings.prompt_tokens, 1)

    setups = {
        spec: DecodeSetup.resolve(model, DecodeConfig.from_spec(spec, budget_pages=4))
        for spec in settings.policies
    }
    results = run_decode_bench(model, prompts, settings, setups)
    runs = results["per_prompt"][0]["policies"]
    assert runs["quest"]["greedy_agreement_with_dense"] < 1.0
    assert runs["quest:verify=8"]["greedy_agreement_with_dense"] == 1.0
    assert runs["quest:verify=8"]["decode"]["verify_passes"] >= 4
