"""bench-tiers on a tiny model: results.json has the issue's fields per policy."""

from __future__ import annotations

import json
from pathlib import Path

from agentcache.bench.tiers import TierBenchConfig, run_policy
from agentcache.bench.tiers_cli import write_tier_results
from agentcache.bench.workload import Session, Turn
from agentcache.model.loading import LoadedModel
from tests.tiers.conftest import agent_turn

FIELDS = ("write_amplification", "write_calls", "ttft_disk_over_resident",
          "throughput_turns_per_s", "throughput_std")  # fmt: skip


def test_bench_tiers_writes_policies_report_and_plot(tiny: LoadedModel, tmp_path: Path) -> None:
    sessions = [
        Session(f"s{s}", "tiny", "", tuple(Turn(agent_turn(t, s), 2) for t in range(2)))
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
        assert p["failed_spills"] == 0 and len(p["round_throughputs"]) == 2
    # lru writes every victim page on its own; slide merges and drops clean pages
    assert saved["policies"]["lru"]["write_calls"] > saved["policies"]["slide"]["write_calls"]
    assert "vs lru" in (tmp_path / "out" / "report.md").read_text()
    assert (tmp_path / "out" / "tiers.png").stat().st_size > 0
    assert out["vs_lru"]["slide"]["write_calls_ratio"] < 1
    assert list(tmp_path.glob("tiers-*")) == []  # disk tiers removed
