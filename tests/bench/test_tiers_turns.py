from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_script


def results(
    path: Path, workload: str, turns: int, wa: float, adopt: bool | None = True,
    deltas: bool = False,
) -> Path:  # fmt: skip
    def policy(wa: float, calls: int, tps: float) -> dict[str, Any]:
        ran = [{"session": f"{workload}-01", "turn": t} for t in range(turns)]
        out = {"write_amplification": wa, "write_calls": calls,
               "throughput_turns_per_s": tps, "throughput_std": 0.01, "turns": ran}  # fmt: skip
        return out | ({"disk_delta_pages": 5} if deltas else {})

    config: dict[str, Any] = {"batch": 8}
    if adopt is not None:
        config["adopt"] = adopt
    data = {
        "policies": {"slide": policy(1.0, 10, 0.2), "lru": policy(wa, 300, 0.25)},
        "sessions": [f"{workload}-00", f"{workload}-01"],
        "config": config,
    }
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps(data), encoding="utf-8")
    return path / "results.json"


def test_runs_are_placed_by_workload_turns_and_write_back(tmp_path: Path) -> None:
    t = load_script("tiers/turns")
    paths = [
        results(tmp_path / "a", "reflexion", 6, 1.25, adopt=None),  # before the option: yes
        results(tmp_path / "b", "reflexion", 16, 3.55, adopt=False),
        results(tmp_path / "c", "memgpt", 16, 1.5),
        results(tmp_path / "d", "memgpt", 16, 3.2, deltas=True),
        results(tmp_path / "e", "memgpt", 6, 2.5, adopt=False, deltas=True),  # no dirty pages
    ]
    out = tmp_path / "out"
    assert t.main([*map(str, paths), "--out", str(out)]) == 0
    md = (out / "wa_turns.md").read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[:5] for r in rows] == [
        ["| memgpt", "yes", "as deltas", "16", "3.20x (>= 3x)"],
        ["| memgpt", "yes", "whole", "16", "1.50x"],
        ["| memgpt", "no", "-", "6", "2.50x"],
        ["| reflexion", "yes", "whole", "6", "1.25x"],
        ["| reflexion", "no", "-", "16", "3.55x (>= 3x)"],
    ]
    assert all(" 30x | 0.80x |" in r for r in rows)  # 300 / 10 calls; 0.2 / 0.25 turns/s
    assert (out / "wa_turns.png").stat().st_size > 0


def test_a_run_without_both_policies_or_of_two_workloads_is_an_error(tmp_path: Path) -> None:
    t = load_script("tiers/turns")
    p = results(tmp_path / "a", "memgpt", 6, 2.0)
    data = json.loads(p.read_text(encoding="utf-8"))
    del data["policies"]["lru"]
    p.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="no lru policy"):
        t.load(p)
    q = results(tmp_path / "b", "memgpt", 6, 2.0)
    data = json.loads(q.read_text(encoding="utf-8"))
    data["sessions"].append("reflexion-00")
    q.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="one workload"):
        t.load(q)
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    assert t.main([str(bad), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()
