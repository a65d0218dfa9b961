"""The replayed rule of benchmarks/reuse/covered_epic.py: `epic` on a covered turn only where
it computes no more tokens, the default's record elsewhere; and the stored outputs are what
the script makes of the stored runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.bench.scripts import load_script

ce = load_script("reuse/covered_epic")
ROOT = Path(__file__).resolve().parents[3]


def turn(strategy: str, n: int, **kw: Any) -> dict[str, Any]:
    row = {"session": "memgpt-00", "turn": n, "strategy": strategy, "prompt_tokens": 100,
           "greedy_exact_match": 1.0, "first_token_agreement": 1.0, "tf_kl": 0.0,
           "recompute_fraction": 0.5, "candidates": 0, "computed_anyway": 10,
           "probe_skipped": False}  # fmt: skip
    return row | kw


def write(folder: Path, turns: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"turns": turns}))


def test_a_covered_turn_takes_epic_only_where_it_computes_no_more(tmp_path: Path) -> None:
    cover_runs = [
        turn("rpdc", 0),  # cold: not replayed
        turn("rpdc", 1, candidates=30, computed_anyway=20),  # covered: 50 tokens exact
        turn("rpdc", 2, candidates=30, computed_anyway=20),  # covered, epic computes more
        turn("rpdc", 3, candidates=90, computed_anyway=10, greedy_exact_match=0.0,
             recompute_fraction=0.2),  # ranked: its own record
    ]  # fmt: skip
    write(tmp_path / "tune-cover" / "memgpt", cover_runs)
    epic_runs = [
        turn("epic", 1, recompute_fraction=0.4, greedy_exact_match=0.0),
        turn("epic", 2, recompute_fraction=0.6),
        turn("epic", 3, recompute_fraction=0.3),
    ]
    write(tmp_path / "wide-budget-memgpt", epic_runs)
    rows = ce.tuning(tmp_path, "memgpt")
    assert [r["covered"] for r in rows] == [True, True, False]
    assert [r["default"] for r in rows] == [(1.0, 1.0, 0.0, 0.5), (1.0, 1.0, 0.0, 0.5),
                                            (0.0, 1.0, 0.0, 0.2)]  # fmt: skip
    assert [r["rule"] for r in rows] == [(0.0, 1.0, 0.0, 0.4), (1.0, 1.0, 0.0, 0.5),
                                         (0.0, 1.0, 0.0, 0.2)]  # fmt: skip


def test_the_stored_outputs_are_the_scripts(tmp_path: Path) -> None:
    ce.main(["--bench", str(ROOT / "docs/bench"), "--out", str(tmp_path)])
    stored = ROOT / "docs/bench/planner/covered-epic"
    for name in ("tune/results.json", "validate/results.json", "report.md"):
        assert (tmp_path / name).read_text() == (stored / name).read_text(), name
