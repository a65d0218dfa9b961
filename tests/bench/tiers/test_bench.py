"""bench-tiers on a tiny model: results.json has the issue's fields per policy."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.bench.tiers import cli as tiers_cli
from agentcache.bench.tiers.bench import TierBenchConfig, run_policy
from agentcache.bench.tiers.cli import write_tier_results
from agentcache.bench.tiers.report import ratios
from agentcache.cli import main
from agentcache.errors import AgentCacheError, CacheDirError
from agentcache.model.loading import LoadedModel
from agentcache.tiers.disk import DiskTier
from agentcache.workload.files import Session, Turn
from tests.conftest import no_model, refusal, usage_error
from tests.tiers.conftest import agent_turn

FIELDS = ("write_amplification", "write_calls", "ttft_disk_over_resident",
          "throughput_turns_per_s", "throughput_std")  # fmt: skip


def test_bench_tiers_writes_policies_report_and_plot(tiny: LoadedModel, tmp_path: Path) -> None:
    sessions = [
        Session(f"s{s}", "tiny", "", tuple(Turn(agent_turn(t, s), 2) for t in range(3)))
        for s in range(4)
    ]
    cfg = TierBenchConfig(("slide", "lru"), batch=4, kv_pages=64, ttft_samples=1, fsync=False,
                          disk_root=tmp_path)  # fmt: skip
    per = {p: run_policy(tiny, sessions, p, cfg, lambda _: None) for p in cfg.policies}
    out = write_tier_results(tmp_path / "out", per, {"model": "tiny", "command": "test",
                             "sessions": [s.name for s in sessions], "config": {}})  # fmt: skip
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(saved["policies"]) == {"slide", "lru"}
    for p in saved["policies"].values():
        assert all(p[f] is not None for f in FIELDS)
        assert p["write_calls"] > 0 and p["write_amplification"] >= 1.0
        assert p["failed_spills"] == 0 and len(p["round_throughputs"]) == 3
        # warm: the rounds after the first, whose turns have nothing to reuse
        warm = p["rounds"][1:]
        assert p["warm_throughput_turns_per_s"] == pytest.approx(
            sum(r["turns"] for r in warm) / sum(r["seconds"] for r in warm)
        )
        assert p["warm_throughput_std"] is not None and p["rounds_s"] > 0
        assert 0 < p["persist_required_bytes"] <= p["persist_required_page_bytes"]
        disk = p["tiers"]["disk"]
        assert disk["loads"] > 0 and p["disk_read_s"] == disk["read_s"] > 0
        # the rounds' store calls, replayed without the model, repeat the run's disk writes
        replayed = p["store_only"]
        assert replayed["matches_run"] and replayed["mismatches"] == []
        assert replayed["turns_per_s"] > 0 and len(replayed["round_throughputs"]) == 3
        # the median of three replays, each on its own fresh store
        assert len(replayed["replays_s"]) == 3 and replayed["seconds"] == replayed["replays_s"][1]
    # lru writes every victim page on its own; slide merges and drops clean pages
    assert saved["policies"]["lru"]["write_calls"] > saved["policies"]["slide"]["write_calls"]
    # slide writes pages that went back to disk with recomputed slots as deltas; lru whole
    assert saved["policies"]["slide"]["disk_delta_pages"] > 0
    assert saved["policies"]["lru"]["disk_delta_pages"] == 0
    assert "delta pages" in (tmp_path / "out" / "report.md").read_text()
    assert "read s" in (tmp_path / "out" / "report.md").read_text()
    assert "store-only turns/s" in (tmp_path / "out" / "report.md").read_text()
    assert out["vs_lru"]["slide"]["store_only_throughput_ratio"] is not None
    lru = saved["policies"]["lru"]  # no policy beats lru by more than its store's share allows
    bound = lru["rounds_s"] / (lru["rounds_s"] - lru["store_only"]["seconds"])
    assert out["vs_lru"]["slide"]["throughput_bound"] == pytest.approx(bound)
    assert "warm turns/s" in (tmp_path / "out" / "report.md").read_text()
    assert "vs lru" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "tiers.png").stat().st_size > 0
    assert out["vs_lru"]["slide"]["write_calls_ratio"] < 1
    assert list(tmp_path.glob("tiers-*")) == []  # disk tiers removed


@pytest.mark.parametrize("adopt", [True, False])
def test_adopt_decides_whether_recomputed_tokens_make_dirty_pages(
    tiny: LoadedModel, tmp_path: Path, adopt: bool
) -> None:
    sessions = [Session("s0", "tiny", "", tuple(Turn(agent_turn(t), 1) for t in range(3)))]
    cfg = TierBenchConfig(("slide",), batch=1, kv_pages=64, ttft_samples=0, fsync=False,
                          disk_root=tmp_path, adopt=adopt)  # fmt: skip
    result = run_policy(tiny, sessions, "slide", cfg, lambda _: None)
    assert (result["dirty_page_updates"] > 0) == adopt


def test_no_store_replays_leaves_the_store_only_figures_out(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    cfg = TierBenchConfig(("slide",), batch=1, kv_pages=64, ttft_samples=0, fsync=False,
                          disk_root=tmp_path, replays=0)  # fmt: skip
    result = run_policy(tiny, one_turn_session(), "slide", cfg, lambda _: None)
    assert result["store_only"] is None and result["throughput_turns_per_s"] > 0
    lru = result | {"store_only": {"turns_per_s": 1.0, "throughput_std": 0.1}}
    assert ratios({"slide": result, "lru": lru})["slide"]["store_only_throughput_ratio"] is None


def test_a_full_disk_keeps_the_rounds_figures_and_says_what_failed(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = DiskTier._write_file

    def full(self: DiskTier, path: Path, data: bytes) -> None:  # the folder opens, pages fail
        if "extents" not in path.parts:
            return opened(self, path, data)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskTier, "_write_file", full)
    sessions = [Session(f"s{s}", "tiny", "", tuple(Turn(agent_turn(t, s), 1) for t in range(2)))
                for s in range(2)]  # fmt: skip
    cfg = TierBenchConfig(("slide",), batch=2, kv_pages=64, ttft_samples=1, fsync=False,
                          disk_root=tmp_path, replays=1)  # fmt: skip
    result = run_policy(tiny, sessions, "slide", cfg, lambda _: None)
    assert result["throughput_turns_per_s"] > 0 and len(result["turns"]) == 4
    assert result["failed_spills"] > 0 and "No space left" in result["tier_errors"][-1]
    assert result["ttft_disk_over_resident"] is None
    assert "No space left" in result["ttft_error"]
    said = tiers_cli.warnings({"slide": result})
    assert any("spills failed" in w for w in said) and any("TTFT from disk" in w for w in said)
    out = write_tier_results(tmp_path / "out", {"slide": result},
                             {"model": "tiny", "command": "test", "sessions": ["s0", "s1"],
                              "config": {}})  # fmt: skip
    assert "**warning**: slide: TTFT from disk" in (tmp_path / "out" / "report.md").read_text()
    assert out["policies"]["slide"]["ttft_error"] == result["ttft_error"]


def one_turn_session() -> list[Session]:
    return [Session("s0", "tiny", "", (Turn(agent_turn(0), 1),))]


def test_a_missing_disk_root_is_created(tiny: LoadedModel, tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    cfg = TierBenchConfig(("slide",), batch=1, kv_pages=64, ttft_samples=0, fsync=False,
                          disk_root=root)  # fmt: skip
    result = run_policy(tiny, one_turn_session(), "slide", cfg, lambda _: None)
    assert result["throughput_turns_per_s"] > 0
    assert root.is_dir() and list(root.iterdir()) == []  # the policy's folder removed


def test_a_disk_root_that_is_a_file_is_a_cache_dir_error(tiny: LoadedModel, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cfg = TierBenchConfig(("slide",), batch=1, kv_pages=64, ttft_samples=0,
                          disk_root=tmp_path / "file" / "sub")  # fmt: skip
    with pytest.raises(CacheDirError, match=r"disk tier folder in .*file/sub \(Not a directory\)"):
        run_policy(tiny, one_turn_session(), "slide", cfg, lambda _: None)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"policies": ()}, "no spill policy"),
        ({"policies": ("nope",)}, "unknown spill policy 'nope'"),
        ({"strategy": "nope"}, "unknown reuse strategy 'nope'"),
        ({"batch": 0}, "batch and kv_pages must be >= 1"),
        ({"kv_pages": 0}, "batch and kv_pages must be >= 1"),
        ({"ttft_samples": -1}, "ttft_samples, host_bytes and replays must be >= 0"),
        ({"replays": -1}, "ttft_samples, host_bytes and replays must be >= 0"),
    ],
)
def test_bad_tier_bench_config_is_a_config_error(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(AgentCacheError, match=needle):
        TierBenchConfig(**options)


def cli(tmp_path: Path, *extra: str) -> list[str]:
    workload = tmp_path / "w.jsonl"
    turn = {"max_new_tokens": 1, "segments": [{"kind": "system", "text": "You are an agent."}]}
    workload.write_text(json.dumps({"name": "s0", "turns": [turn]}) + "\n")
    return ["bench-tiers", str(workload), "--policies", "slide", "--out", str(tmp_path / "out"),
            "--threads", str(torch.get_num_threads()), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("option", "needle"),
    [("--disk-dir", "--disk-dir {} is a file, not a folder"), ("--out", "--out {} is a file")],
)
def test_cli_rejects_a_file_as_a_folder_before_loading_the_model(
    option: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(tiers_cli, "load_model", no_model)
    file = tmp_path / "file"
    file.write_text("x")
    assert main([*cli(tmp_path), option, str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentcache: error: ") and needle.format(file) in err


def test_cli_creates_a_missing_disk_dir_and_runs(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiers_cli, "load_model", lambda path, cache_dir: tiny)
    disk = tmp_path / "does-not-exist" / "tiers"
    argv = cli(tmp_path, "--disk-dir", str(disk), "--batch", "1", "--kv-pages", "64")
    assert main(argv) == 0
    assert disk.is_dir() and (tmp_path / "out" / "results.json").is_file()
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["config"]["adopt"] is True
    assert main([*argv, "--no-adopt"]) == 0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["config"]["adopt"] is False


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--batch", "0"], "argument --batch: must be an integer >= 1, got '0'"),
        (["--kv-pages", "-5"], "argument --kv-pages: must be an integer >= 1, got '-5'"),
        (["--new-tokens", "-1"], "argument --new-tokens: must be an integer >= 1"),
        (["--max-turns", "0"], "argument --max-turns: must be an integer >= 1"),
        (["--host-mib", "-1"], "argument --host-mib: must be an integer >= 0"),
        (["--ttft-samples", "x"], "argument --ttft-samples: must be an integer >= 0, got 'x'"),
    ],
)
def test_cli_rejects_numbers_out_of_range(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(cli(tmp_path, *argv), capsys)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--policies", ","], "--policies ',' names no spill policy"),
        (["--strategy", "rpdc:ratio=0.5"], "unknown reuse strategy 'rpdc:ratio=0.5'"),
    ],
)
def test_cli_rejects_bad_names_before_loading_the_model(
    argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(tiers_cli, "load_model", no_model)
    assert needle in refusal(cli(tmp_path, *argv), capsys)
