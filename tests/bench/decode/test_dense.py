"""bench-dense-decode on the tiny model: every path decodes the same greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.bench.decode.dense import PATHS, DenseBenchSettings, run_dense_bench
from agentcache.bench.decode.report import render_dense
from agentcache.heads.prompts import token_prompts
from agentcache.model.loading import from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.testing import tiny_hf_model
from tests.conftest import no_model, refusal, usage_error
from tests.decode.conftest import TEXT


def test_every_path_decodes_the_same_tokens_and_is_timed() -> None:
    hf = tiny_hf_model()
    model = from_hf(hf, ByteTokenizer(), "tiny")
    settings = DenseBenchSettings(contexts=(200, 400), new_tokens=12, num_prompts=2)
    prompts = {c: token_prompts(model, [TEXT], c - 12, 2) for c in settings.contexts}
    steps: list[str] = []
    got = run_dense_bench(model, hf, prompts, settings, steps.append)
    assert set(got) == {"200", "400"} and len(steps) == 2 * 2 * 3 * 11
    for context, rec in got.items():
        assert [r["prompt_tokens"] for r in rec["per_prompt"]] == [int(context) - 12] * 2
        for r in rec["per_prompt"]:
            assert len(r["engine"]["tokens"]) == 12
            assert {r[p]["greedy_agreement_with_engine"] for p in PATHS} == {1.0}
        summary = rec["summary"]
        assert summary["engine"]["engine_speedup_median"] == 1.0
        assert all(summary[p]["tokens_per_s_min"] > 0 for p in PATHS)
    results = {"model": model.model_id, "command": "test", "settings": settings.__dict__,
               "machine": {"cores": 1, "torch_threads": 1}, "contexts": got}  # fmt: skip
    assert "| 400 |" in render_dense(results)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--contexts", "64", "--new-tokens", "64"], "every context must exceed new_tokens"),
        (["--new-tokens", "1"], "need new_tokens >= 2"),
    ],
)
def test_bad_arguments_fail_before_the_model_loads(
    argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("some text")
    assert needle in refusal(["bench-dense-decode", str(prompts), *argv, "--threads", "1"], capsys)


@pytest.mark.parametrize("contexts", ["1024,x", "0", "", "1024,,4096"])
def test_contexts_that_are_not_positive_integers_are_usage_errors(
    contexts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(["bench-dense-decode", "--contexts", contexts], capsys)
    assert f"argument --contexts: must be a comma list of integers >= 1, got {contexts!r}" in err
