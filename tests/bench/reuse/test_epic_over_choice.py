"""The replay of benchmarks/reuse/epic_over_choice.py: which tuning turns `epic_over=r`
switches (ranked by the default and more than r candidates per computed token), judged by
`epic`'s record there; the smallest r with no family losing agreement is chosen; and the
stored outputs are what the script makes of the stored runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_script

eo = load_script("reuse/epic_over_choice")
ROOT = Path(__file__).resolve().parents[3]


def turn(strategy: str, n: int, **kw: Any) -> dict[str, Any]:
    row = {"session": "x-00", "turn": n, "strategy": strategy, "greedy_exact_match": 1.0,
           "first_token_agreement": 1.0, "recompute_fraction": 0.5, "candidates": 0,
           "computed_anyway": 10, "probe_skipped": False, "ttft_ms": 100.0}  # fmt: skip
    return row | kw


def test_a_turn_switches_only_when_ranked_and_thin() -> None:
    # covered by cover_min (256 candidates), by cover (1.5 per computed), by the probe
    assert not eo.switched(turn("rpdc", 1, candidates=256, computed_anyway=10), 4.0)
    assert not eo.switched(turn("rpdc", 1, candidates=600, computed_anyway=400), 1.0)
    assert not eo.switched(turn("rpdc", 1, candidates=900, computed_anyway=10,
                                probe_skipped=True), 4.0)  # fmt: skip
    thin = turn("rpdc", 1, candidates=900, computed_anyway=200)
    assert eo.switched(thin, 4.0) and not eo.switched(thin, 4.5)


def test_the_smallest_ratio_without_a_loss_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At r = 2 the rule also switches a turn where `epic` parts from full's at its first
    token and the default did not; at 4 only the thin turn where `epic` keeps what the
    default lost."""
    runs = [
        turn("rpdc", 0),
        turn("rpdc", 1, candidates=900, computed_anyway=300),  # 3 per computed
        turn("epic", 1, greedy_exact_match=0.0, first_token_agreement=0.0),
        turn("prefix", 1),
        turn("rpdc", 2, candidates=900, computed_anyway=100, greedy_exact_match=0.0),  # 9
        turn("epic", 2, ttft_ms=40.0),
        turn("prefix", 2),
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"turns": runs}))
    monkeypatch.setattr(eo, "TUNING", {"x": "run"})
    monkeypatch.setattr(eo, "VALIDATION", {})
    eo.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    out = json.loads((tmp_path / "out" / "results.json").read_text())
    assert out["no_loss"] == {"2": False, "4": True, "8": True} and out["chosen"] == 4.0
    at4 = out["families"]["x"]["4"]
    assert at4["turns"] == [["x-00", 2]]
    assert (at4["default"]["greedy"], at4["rule"]["greedy"]) == (0.0, 1.0)
    assert at4["rule"]["ttft_vs_prefix_median"] == pytest.approx(0.4)


def test_the_stored_outputs_are_the_scripts(tmp_path: Path) -> None:
    eo.main(["--out", str(tmp_path)])
    stored = ROOT / "docs/bench/epic-over/choice"
    for name in ("results.json", "report.md"):
        assert (tmp_path / name).read_text() == (stored / name).read_text(), name
