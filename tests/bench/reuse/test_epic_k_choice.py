"""The replay of benchmarks/reuse/epic_k_choice.py: it reads only the turns on which the
default computes chunk starts, chooses the smallest `epic_k` with no family losing agreement
there (else keeps 64), refuses runs that lack a variant, and its stored outputs are what it
makes of the stored runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_script

ek = load_script("reuse/epic_k_choice")
ROOT = Path(__file__).resolve().parents[3]


def turn(k: int | str, n: int, **kw: Any) -> dict[str, Any]:
    strategy = k if isinstance(k, str) else ek.label(k)
    row = {"session": "x-00", "turn": n, "strategy": strategy, "greedy_exact_match": 1.0,
           "first_token_agreement": 1.0, "recompute_fraction": 0.5, "ttft_ms": 100.0,
           "epic_turn": False}  # fmt: skip
    return row | kw


def write(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"turns": rows}))


def every(n: int, epic: bool, **by_k: dict[str, Any]) -> list[dict[str, Any]]:
    return [turn("prefix", n, ttft_ms=200.0)] + [
        turn(k, n, epic_turn=epic, **by_k.get(f"k{k}", {})) for k in (64, 8, 16, 32)
    ]


def test_the_smallest_k_without_a_loss_on_chunk_start_turns_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """epic_k=8 parts from full's continuation on a chunk-start turn where 64 did not; its loss
    on a turn the default ranks (no chunk starts) is not read."""
    rows = [
        turn(64, 0),
        *every(1, True, k8={"greedy_exact_match": 0.0}, k16={"ttft_ms": 50.0}),
        *every(2, False, k8={"first_token_agreement": 0.0}, k16={"greedy_exact_match": 0.0}),
    ]
    write(tmp_path, rows)
    monkeypatch.setattr(ek, "TUNING", {"x": ["run"]})
    monkeypatch.setattr(ek, "VALIDATION", {})
    ek.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    out = json.loads((tmp_path / "out" / "results.json").read_text())
    assert out["no_loss"] == {"8": False, "16": True, "32": True} and out["chosen"] == 16
    x = out["families"]["x"]
    assert x["turns"] == [["x-00", 1]] and x["warm_turns"] == 2
    assert (x["64"]["greedy"], x["8"]["greedy"]) == (1.0, 0.0)
    assert x["16"]["ttft_vs_prefix_median"] == pytest.approx(0.25)


def test_a_loss_at_every_k_keeps_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lost = {"first_token_agreement": 0.0}
    write(tmp_path, every(1, True, k8=lost, k16=lost, k32=lost))
    monkeypatch.setattr(ek, "TUNING", {"x": ["run"]})
    ek.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "results.json").read_text())["chosen"] == 64


def test_a_run_without_a_variant_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [r for r in every(1, True) if r["strategy"] != ek.label(16)]
    write(tmp_path, rows)
    monkeypatch.setattr(ek, "TUNING", {"x": ["run"]})
    with pytest.raises(SystemExit, match="no record of every epic_k"):
        ek.main(["--root", str(tmp_path), "--out", str(tmp_path / "out")])


def test_the_stored_outputs_are_the_scripts(tmp_path: Path) -> None:
    ek.main(["--out", str(tmp_path)])
    stored = ROOT / "docs/bench/epic-k/choice"
    for name in ("results.json", "report.md"):
        assert (tmp_path / name).read_text() == (stored / name).read_text(), name
