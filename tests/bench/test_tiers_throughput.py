from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_script


def policy(round_s: list[float], store_s: float | None = None) -> dict[str, Any]:
    rounds = [{"batch": 0, "turn": t, "turns": 8, "seconds": s} for t, s in enumerate(round_s)]
    tput = 8 * len(round_s) / sum(round_s)
    out: dict[str, Any] = {
        "rounds": rounds,
        "throughput_turns_per_s": tput,
        "throughput_std": 0.1,
        "write_amplification": 1.0,
        "write_calls": 1,
    }
    if store_s is not None:
        out["store_only"] = {"seconds": store_s, "turns_per_s": 1.0, "throughput_std": 0.1}
    return out


def results(path: Path, workload: str, slide: dict[str, Any], lru: dict[str, Any]) -> Path:
    data = {"policies": {"slide": slide, "lru": lru}, "sessions": [f"{workload}-01"]}
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps(data), encoding="utf-8")
    return path / "results.json"


def test_warm_rounds_and_the_bound_from_lrus_store_time(tmp_path: Path) -> None:
    t = load_script("tiers/throughput")
    with_replay = results(
        tmp_path / "a", "swe_agent", policy([40, 10, 8], 5.0), policy([40, 20, 16], 19.0)
    )
    no_replay = results(tmp_path / "b", "memgpt", policy([30, 15]), policy([30, 15]))
    out = tmp_path / "out"
    assert t.main([str(with_replay), str(no_replay), "--out", str(out)]) == 0
    a, b = t.load(with_replay), t.load(no_replay)
    assert a.ratio == pytest.approx(76 / 58)  # every round: 24 turns in 58 s against 76 s
    assert a.warm_ratio == pytest.approx(2.0)  # warm: 16 turns in 18 s against 36 s
    assert a.warm_std_ratio == pytest.approx(2.0)  # (0.8, 1.0) against (0.4, 0.5) turns/s
    assert a.bound == pytest.approx(76 / (76 - 19))  # lru's 76 s less its 19 s of store
    assert a.lru_rounds_s == 76 and a.turns == 3
    assert b.ratio == pytest.approx(1.0) and b.bound is None and b.warm_std_ratio is None
    md = (out / "throughput.md").read_text(encoding="utf-8")
    assert "| swe_agent | 3 | 76 | 1.31x | 2.00x | " in md and "| 1.33x |" in md
    assert (out / "throughput.png").stat().st_size > 0


def test_a_run_without_both_policies_or_not_json_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = load_script("tiers/throughput")
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"policies": {"slide": policy([1.0])}}), encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    for path, message in ((one, "no lru policy"), (bad, "not JSON")):
        assert t.main([str(path), "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
