"""The bench report's cold-turn summary and dominance check."""

from __future__ import annotations

from typing import Any

from agentcache.bench.reuse.report import (
    _cold_sentence,
    cold,
    dominated_by,
    peer_ratios,
    render_markdown,
)


def _row(ttft: float, compute: float, kl: float) -> dict[str, float]:
    return {"ttft_ratio_vs_full": ttft, "recompute_fraction_mean": compute, "tf_kl_mean": kl}


def test_dominated_by_needs_all_three() -> None:
    summary = {
        "default": _row(0.40, 0.40, 5e-4),
        "beats": _row(0.39, 0.40, 3e-4),  # faster, same compute, lower KL: dominates
        "slower": _row(0.41, 0.30, 1e-4),  # lower KL and compute but slower: does not
        "costlier": _row(0.30, 0.45, 1e-4),  # more compute: does not
        "noise": _row(0.10, 0.10, 5e-4 - 1e-12),  # KL lower only by float noise: does not
    }
    got = dominated_by(summary)
    assert got["default"] == ["beats"]
    assert got["beats"] == []
    assert "noise" not in got["default"]


def _turn(strategy: str, turn: int, ttft: float, full: float) -> dict[str, Any]:
    return {"strategy": strategy, "turn": turn, "ttft_ms": ttft, "ttft_full_ms": full}


def test_cold_reads_first_turns_only() -> None:
    records = [
        _turn("pic", 0, 110.0, 100.0),
        _turn("pic", 0, 90.0, 100.0),
        _turn("pic", 0, 100.0, 100.0),
        _turn("pic", 1, 10.0, 100.0),  # warm: not cold
    ]
    got = cold(records)["pic"]
    assert got["turns"] == 3
    assert got["median"] == 1.0
    assert got["max"] == 1.1


def test_cold_reads_what_a_strategy_adds_against_fulls_overhead_on_the_same_turn() -> None:
    def first(strategy: str, session: str, overhead: float) -> dict[str, Any]:
        return _turn(strategy, 0, 100.0, 1000.0) | {
            "workload": "w", "session": session, "overhead_ms": overhead,
        }  # fmt: skip

    records = [
        first("full", "a", 40.0), first("full", "b", 10.0),
        first("rpdc", "a", 50.0), first("rpdc", "b", 40.0),  # +10 and +30 ms on 1000 ms
        first("pic", "a", 40.0),
        _turn("transformers-prefix", 0, 100.0, 1000.0),  # the peer reports no overhead
    ]  # fmt: skip
    got = cold(records)
    assert got["rpdc"]["added_median"] == 0.02 and got["rpdc"]["added_max"] == 0.03
    assert got["pic"]["added_max"] == 0.0 and got["full"]["added_max"] == 0.0
    assert "added_median" not in got["transformers-prefix"]
    md = _cold_sentence(got)
    assert "`rpdc` +2.00% (max +3.00%)" in md and "`full` +" not in md


def test_report_names_the_dominated(tmp_path: Any) -> None:
    cols = {
        "ttft_ratio_vs_limit": 1.0, "kl_first_token_mean": 0.0, "tf_top1_agreement": 1.0,
        "first_token_agreement": 1.0, "greedy_exact_match": 1.0,
        "greedy_agree_prefix_mean": 1.0, "top5_overlap_mean": 1.0, "ttft_ms_median": 1.0,
        "overhead_ms_median": 1.0, "turns": 1,
    }  # fmt: skip
    results = {
        "strategies": {"rpdc": _row(0.5, 0.5, 1e-3) | cols, "epic": _row(0.4, 0.4, 1e-4) | cols},
        "by_case": {}, "by_workload": {}, "skipped_lines": [],
        "machine": {"cores": 2, "torch_threads": 1},
        "cold": {"rpdc": {"median": 1.01, "max": 1.02, "turns": 2}},
    }  # fmt: skip
    md = render_markdown(results)
    assert "`rpdc` by `epic`" in md
    assert "`rpdc` 1.01 (max 1.02)" in md


def test_peer_ratios_pair_the_same_warm_turn() -> None:
    def rec(strategy: str, session: str, turn: int, ttft: float) -> dict[str, Any]:
        return {"strategy": strategy, "session": session, "workload": "w", "turn": turn,
                "ttft_ms": ttft, "ttft_full_ms": 1000.0}  # fmt: skip

    records = [
        rec("transformers-prefix", "a", 1, 100.0), rec("rpdc", "a", 1, 50.0),
        rec("transformers-prefix", "b", 1, 400.0), rec("rpdc", "b", 1, 400.0),
        rec("transformers-prefix", "b", 2, 100.0), rec("rpdc", "b", 2, 300.0),
        rec("transformers-prefix", "a", 0, 1.0), rec("rpdc", "a", 0, 1000.0),  # cold: left out
    ]  # fmt: skip
    got = peer_ratios(records)
    assert got["rpdc"] == 1.0  # median of 0.5, 1.0, 3.0
    assert got["transformers-prefix"] == 1.0
    assert peer_ratios([r for r in records if r["strategy"] == "rpdc"]) == {}
