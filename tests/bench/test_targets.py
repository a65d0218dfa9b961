from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.scripts import load_script


def test_ttft_against_prefix_is_the_median_of_per_turn_ratios_not_of_medians() -> None:
    targets = load_script("reuse/targets")
    ms = {"rpdc": [40.0, 70.0, 85.0, 100.0, 130.0], "prefix": [50.0, 100.0, 90.0, 100.0, 100.0]}
    turns = [
        {"session": "s", "turn": t, "strategy": label, "ttft_ms": values[t - 1]}
        for label, values in ms.items()
        for t in range(1, 6)
    ]
    cold = [{"session": "s", "turn": 0, "strategy": x, "ttft_ms": 1.0} for x in ms]
    got = targets.vs_base({"turns": cold + turns}, "rpdc", "prefix")
    assert round(got, 3) == 0.944  # per turn 0.8, 0.7, 0.944, 1.0, 1.3; medians 85/100 = 0.85


def _run(default_vs_prefix: float) -> dict[str, object]:
    """A two-strategy run: the default at `default_vs_prefix` of prefix's TTFT on one turn."""
    summary = {"greedy_exact_match": 1.0, "first_token_agreement": 1.0, "tf_kl_mean": 0.0,
               "recompute_fraction_mean": 0.5, "turns": 1}  # fmt: skip
    strategies = {
        "rpdc": summary | {"ttft_ratio_vs_full": default_vs_prefix, "ttft_ratio_vs_peer": 0.65},
        "prefix": summary | {"ttft_ratio_vs_full": 1.0},
    }
    turns = [
        {"session": "s", "turn": 1, "strategy": "rpdc", "ttft_ms": 100.0 * default_vs_prefix},
        {"session": "s", "turn": 1, "strategy": "prefix", "ttft_ms": 100.0},
    ]
    return {"strategies": strategies, "default_strategy": "rpdc", "turns": turns,
            "by_workload": {"w": {}}, "sessions": ["s"]}  # fmt: skip


def test_speed_targets_are_the_ones_given_and_no_peer_target_leaves_it_out() -> None:
    targets = load_script("reuse/targets")
    usual = targets.family(_run(0.7))
    assert usual["met"]["vs_prefix"] and usual["met"]["vs_peer"]  # 0.7 <= 0.8, 0.65 <= 0.67
    edits = targets.family(_run(0.7), vs_prefix_target=0.6, vs_peer_target=None)
    assert not edits["met"]["vs_prefix"] and "vs_peer" not in edits["met"]
    assert edits["vs_peer"] == 0.65  # still reported
    md = targets.render({"w": edits}, None, "cmd", vs_prefix_target=0.6, vs_peer_target=None)
    assert "0.70x (**missed**)" in md and "0.65x |" in md and "peer's" not in md.split("|")[0]


def test_turns_split_by_their_edit_per_strategy_with_per_turn_ratios() -> None:
    targets = load_script("reuse/targets")
    kinds = targets.turn_edits([Path("benchmarks/workloads/chat-retry.jsonl")])
    assert kinds[("chat-retry-06", 0)] == "append"  # the first request: start, read as append
    assert kinds[("chat-retry-06", 2)] == "retry"
    assert kinds[("chat-retry-06", 1)] == "append"

    def turn(t: int, strategy: str, ms: float, greedy: float = 1.0) -> dict[str, object]:
        return {"session": "chat-retry-06", "turn": t, "strategy": strategy, "ttft_ms": ms,
                "greedy_exact_match": greedy, "first_token_agreement": 1.0,
                "recompute_fraction": ms / 1000}  # fmt: skip

    results = {"turns": [
        turn(0, "rpdc", 900), turn(0, "prefix", 900), turn(0, "full", 900),  # cold: left out
        turn(1, "rpdc", 50), turn(1, "prefix", 100), turn(1, "full", 200),
        turn(2, "rpdc", 30, greedy=0.0), turn(2, "prefix", 100), turn(2, "full", 200),
        turn(3, "rpdc", 90), turn(3, "prefix", 100), turn(3, "full", 200),
    ]}  # fmt: skip
    got = targets.by_edit(results, kinds)
    assert set(got) == {"append", "retry"} and set(got["retry"]) == {"rpdc"}
    retry, append = got["retry"]["rpdc"], got["append"]["rpdc"]
    assert retry["turns"] == 1 and retry["greedy_exact"] == 0.0 and retry["vs_prefix"] == 0.3
    assert append["turns"] == 2 and append["greedy_exact"] == 1.0
    assert round(append["vs_prefix"], 3) == 0.7 and append["vs_prefix_max"] == 0.9
    assert round(append["prefix_compute"], 3) == 0.1

    fam = {"by_edit": got, "default": "rpdc"}
    md = "\n".join(targets.render_by_edit({"chat-retry": fam}, 0.6))
    assert "| chat-retry | retry | `rpdc` | 1 | 0.00 | 1.00 | 0.30x (0.30-0.30) (met) |" in md
    assert "| chat-retry | append | `rpdc` | 2 |" in md and "0.70x (0.50-0.90) |" in md

    stranger = {"turns": [turn(1, "rpdc", 50) | {"session": "elsewhere"}]}
    with pytest.raises(SystemExit, match="elsewhere turn 1"):
        targets.by_edit(stranger, kinds)
