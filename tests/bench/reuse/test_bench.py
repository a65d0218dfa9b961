from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentcache.bench.reuse.harness import BenchRunner, StrategySpec, parse_specs
from agentcache.bench.reuse.report import write_results
from agentcache.errors import AgentCacheError, ConfigError, UnknownStrategyError
from agentcache.model.loading import LoadedModel
from agentcache.workload.files import load_workload
from tests.conftest import no_model, refusal, usage_error

REQUIRED = {
    "ttft_ms_median", "ttft_ratio_vs_full", "ttft_ratio_vs_limit", "first_token_agreement",
    "greedy_exact_match", "greedy_agree_prefix_mean", "kl_first_token_mean", "tf_kl_mean",
    "tf_top1_agreement", "top5_overlap_mean", "recompute_fraction_mean",
    "fast_tier_kv_bytes_peak", "turns",
}  # fmt: skip


def turn(update: str) -> dict[str, object]:
    return {
        "max_new_tokens": 4,
        "segments": [
            {"kind": "system", "text": "You are an agent. " * 3, "role": "system"},
            {"kind": "update", "text": update, "id": "mem", "role": "user"},
            {"kind": "fixed", "text": "History: asked about the weather. " * 2, "role": "user"},
            {"kind": "update", "text": "The answer is", "role": "assistant"},
        ],
    }


def write_workload(path: Path) -> Path:
    good = {"name": "s1", "case": "swing", "turns": [turn("short"), turn("longer memory " * 8)]}
    bad_kind = {"name": "s2", "turns": [{"segments": [{"kind": "weird", "text": "x"}]}]}
    path.write_text(json.dumps(good) + "\n" + "{not json\n" + json.dumps(bad_kind) + "\n")
    return path


def test_bad_lines_are_reported_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    loaded = load_workload(write_workload(tmp_path / "w.jsonl"))
    assert [s.name for s in loaded.sessions] == ["s1"]
    assert len(loaded.problems) == 2
    assert ":2: not valid JSON" in loaded.problems[0]
    assert ":3:" in loaded.problems[1] and "unknown segment kind 'weird'" in loaded.problems[1]


def test_strategy_specs() -> None:
    specs = parse_specs("pic,cacheblend:ratio=0.3,default")
    assert [s.label for s in specs] == ["full", "pic", "cacheblend:ratio=0.3", "rpdc"]
    assert specs[2].options == {"ratio": 0.3}
    with pytest.raises(UnknownStrategyError, match=r"known: .*cacheslide"):
        StrategySpec.parse("nope")


def test_bench_end_to_end_on_tiny_model(tiny: LoadedModel, tmp_path: Path) -> None:
    loaded = load_workload(write_workload(tmp_path / "w.jsonl"))
    specs = parse_specs("prefix,pic,epic,cacheslide,rpdc,rpdc:ratio=1.0")
    seen: list[str] = []
    records = BenchRunner(tiny, specs, kv_pages=256).run_session(loaded.sessions[0], seen.append)
    assert len(records) == len(seen) == 2 * len(specs)
    results = write_results(
        tmp_path / "out", records, {"model": tiny.model_id}, list(loaded.problems)
    )
    on_disk = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(on_disk["strategies"]) == {s.label for s in specs}
    for summary in on_disk["strategies"].values():
        assert set(summary) >= REQUIRED
    full = results["strategies"]["full"]
    assert full["kl_first_token_mean"] == 0.0 and full["greedy_exact_match"] == 1.0
    assert on_disk["by_case"]["swing"]["pic"]["turns"] == 1  # the warm turn; turn 0 is cold
    # every candidate within the budget: computed without a probe, and counted
    assert on_disk["strategies"]["rpdc:ratio=1.0"]["probe_skipped_turns"] == 1
    assert on_disk["strategies"]["pic"]["probe_skipped_turns"] == 0
    assert len(on_disk["turns"]) == 2 * len(specs)
    for name in ("report.md", "ttft_ratio.png", "fidelity_vs_ttft.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert "| rpdc |" in (tmp_path / "out" / "report.md").read_text()
    assert all(0.0 < r["overhead_ms"] < r["ttft_ms"] for r in on_disk["turns"])
    assert "overhead ms" in (tmp_path / "out" / "report.md").read_text()
    made = on_disk["provenance"]  # what the run measured, for the figures quoting it
    assert made["specs"]["rpdc"].startswith("rpdc:cover=1.5:")
    assert made["specs"]["rpdc:ratio=1.0"] != made["specs"]["rpdc"]
    assert set(made) >= {"commit", "command", "date", "machine", "split", "sessions"}


def test_bench_cope_runs_the_models_adapter_or_says_how_to_train_one(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from agentcache.bench import cli as bench_cli
    from agentcache.cli import main
    from agentcache.cope.checkpoint import adapter_path, save_adapter
    from agentcache.model.cope import CoPEAdapter, CoPEConfig

    monkeypatch.setattr(bench_cli, "load_model", lambda path, cache_dir: tiny)
    workload = write_workload(tmp_path / "w.jsonl")
    argv = ["bench", str(workload), "--cope", "--cache-dir", str(tmp_path / "cache"),
            "--strategies", "full,pic", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    assert "train-cope" in capsys.readouterr().err
    adapter = CoPEAdapter.init(tiny.forward, CoPEConfig(rank=2), seed=1)
    save_adapter(adapter_path(tmp_path / "cache", tiny.model_id), adapter, tiny.model_id)
    assert main(argv) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert "+cope-" in results["model"] and set(results["strategies"]) == {"full", "pic"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rpdc:extra=abc", "strategy 'rpdc:extra=abc': extra must be a number, got 'abc'"),
        ("rpdc:nosuch=1", "rpdc: unknown options ['nosuch']"),
        ("epic:boundary_k=-1", "boundary_k, starts, gate_every, probe_layers must be >= 0"),
        ("rpdc:starts=-1", "boundary_k, starts, gate_every, probe_layers must be >= 0"),
        ("rpdc:ratio=2", "ratio must be in [0, 1], got 2"),
        ("prefix:x=1", "prefix takes no options"),
        ("rpdc:extra", "strategy option 'extra' in 'rpdc:extra' is not key=value"),
    ],
)
def test_bad_strategy_options_fail_when_parsed(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        StrategySpec.parse(text)
    assert needle in str(e.value)


def bench_argv(tmp_path: Path, *extra: str) -> list[str]:
    workload = write_workload(tmp_path / "w.jsonl")
    return ["bench", str(workload), "--strategies", "prefix", "--out", str(tmp_path / "out"),
            "--threads", str(torch.get_num_threads()), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--strategies", "rpdc:extra=abc"], "extra must be a number, got 'abc'"),
        (["--strategies", "epic:boundary_k=-1"], "boundary_k"),
        (["--sessions", "nosuch"], "--sessions: no session named nosuch in the workload files"),
        (
            ["--sessions", "s1,nosuch"],
            "no session named nosuch in the workload files; they hold: s1",
        ),
        (["--case", "nosuch"], "--case nosuch: no session of that case; cases: swing"),
        (["--case", "swing", "--sessions", "s9"], "no session named s9"),
        (["--resume"], "--resume applies to --backend vllm"),
        (["--out", "{file}"], "--out {file} is a file, not a folder"),
        (
            ["--out", "{file}/sub"],
            "--out {file}/sub cannot be created or written (Not a directory)",
        ),
    ],
)
def test_bench_rejects_bad_arguments_before_loading_the_model(
    extra: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from agentcache.bench import cli as bench_cli

    monkeypatch.setattr(bench_cli, "load_model", no_model)
    file = tmp_path / "file"
    file.write_text("x")
    argv = bench_argv(tmp_path, *(a.format(file=file) for a in extra))
    assert needle.format(file=file) in refusal(argv, capsys)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--max-turns", "0"], "argument --max-turns: must be an integer >= 1, got '0'"),
        (["--max-sessions", "-1"], "argument --max-sessions: must be an integer >= 1, got '-1'"),
        (["--new-tokens", "0"], "argument --new-tokens: must be an integer >= 1, got '0'"),
    ],
)
def test_bench_rejects_numbers_out_of_range(
    extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    assert needle in usage_error(bench_argv(tmp_path, *extra), capsys)


def test_a_workload_that_is_a_folder_or_not_text_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AgentCacheError, match=r"workload file .* is a folder, not a file"):
        load_workload(tmp_path)
    binary = tmp_path / "w.jsonl"
    binary.write_bytes(b'{"name": "\xff\xfe"}\n')
    with pytest.raises(AgentCacheError, match=r"w.jsonl is not UTF-8 text \(byte 10 "):
        load_workload(binary)


@pytest.mark.parametrize("value", [-1, "abc", 2.5, True])
def test_a_bad_max_new_tokens_skips_the_line(tmp_path: Path, value: object) -> None:
    bad = {"name": "bad", "turns": [{**turn("x"), "max_new_tokens": value}]}
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"name": "ok", "turns": [turn("x")]}) + "\n" + json.dumps(bad))
    loaded = load_workload(path)
    assert [s.name for s in loaded.sessions] == ["ok"]
    assert loaded.problems == (
        f"{path}:2: turn 0: max_new_tokens must be an integer >= 0, got {value!r}; skipped",
    )


def test_a_bad_workload_leaves_no_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentcache.cli import main

    out = tmp_path / "out"
    argv = ["bench", str(tmp_path / "none.jsonl"), "--out", str(out), "--threads", "1"]
    assert main(argv) == 2
    assert "none.jsonl does not exist" in capsys.readouterr().err and not out.exists()


def test_a_segment_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    bad = json.dumps({"name": "s", "turns": [{"segments": [1]}]})
    path.write_text(bad + "\n" + json.dumps({"name": "ok", "turns": [turn("x")]}) + "\n")
    assert load_workload(path).problems == (
        f"{path}:1: turn 0: segment 0 must be an object, got int; skipped",
    )


def test_an_unreadable_workload_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_workload(tmp_path / "w.jsonl")

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(AgentCacheError, match=r"w\.jsonl cannot be read \(Permission denied\)"):
        load_workload(path)
