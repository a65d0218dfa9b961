from __future__ import annotations

from typing import Any

import pytest

from agentcache.bench.reuse.planner.report import Rates, by_turn, fastest_at_floor
from tests.bench.scripts import load_script


def _records(spec: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Per strategy, per warm turn (TTFT ms, greedy exact); full takes 100 ms on every turn."""
    out = []
    for label, turns in spec.items():
        for t, (ms, greedy) in enumerate(turns, start=1):
            out.append({"session": "s", "turn": t, "strategy": label, "ttft_ms": ms,
                        "greedy_exact_match": greedy, "first_token_agreement": 1.0,
                        "tf_kl": 0.0, "recompute_fraction": ms / 100})  # fmt: skip
    return out


def test_the_rule_takes_the_fastest_strategy_at_the_floor_and_never_full_the_peer_or_plan() -> None:
    ten = 10
    spec = {
        "full": [(100.0, 1.0)] * ten,
        "transformers-prefix": [(5.0, 1.0)] * ten,  # fastest, but the peer is no candidate
        "plan": [(6.0, 1.0)] * ten,  # nor is the planner
        "pic": [(20.0, 1.0)] * 8 + [(20.0, 0.0)] * 2,  # faster, greedy 0.8: under the floor
        "epic": [(40.0, 1.0)] * 9 + [(40.0, 0.0)],  # greedy 0.9: at the floor
        "prefix": [(60.0, 1.0)] * ten,
    }
    turns = list(by_turn(_records(spec)).values())
    assert fastest_at_floor(turns, Rates()) == "epic"
    # one more miss and epic falls under the floor too: prefix is the fastest left
    spec["epic"] = [(40.0, 1.0)] * 8 + [(40.0, 0.0)] * 2
    turns = list(by_turn(_records(spec)).values())
    assert fastest_at_floor(turns, Rates()) == "prefix"


def test_targets_read_the_median_over_the_oracle_and_the_worst_turn_over_prefix() -> None:
    choice = load_script("reuse/tuned_choice")
    spec = {
        "full": [(100.0, 1.0)] * 3,
        "prefix": [(50.0, 1.0)] * 3,
        "rpdc": [(30.0, 1.0), (40.0, 1.0), (52.0, 1.0)],
        "epic": [(30.0, 1.0), (32.0, 1.0), (40.0, 1.0)],
    }
    turns = list(by_turn(_records(spec)).values())
    oracle = fastest_at_floor(turns, Rates())
    assert oracle == "epic"
    got = choice.targets(turns, "rpdc", oracle, Rates(), 0.75)
    assert got["vs_oracle"] == pytest.approx(1.25)  # per turn 1.0, 1.25, 1.3
    assert not got["within_oracle"]
    assert got["worst_vs_prefix"] == pytest.approx(1.04) and not got["never_slower"]
    assert got["vs_prefix"] == pytest.approx(0.8) and not got["faster_than_prefix"]


def test_a_run_of_the_wrong_split_is_refused(tmp_path) -> None:
    choice = load_script("reuse/tuned_choice")
    (tmp_path / "results.json").write_text('{"split": "validate", "turns": []}')
    with pytest.raises(SystemExit, match="not 'tune'"):
        choice.load(tmp_path, "tune")


def test_family_keeps_one_workload_and_names_the_families_a_run_has(tmp_path) -> None:
    choice = load_script("reuse/tuned_choice")
    records = []
    for family, ms in (("memgpt", 30.0), ("reflexion", 70.0)):
        for r in _records({"full": [(100.0, 1.0)] * 2, "epic": [(ms, 1.0)] * 2}):
            records.append({**r, "session": f"{family}-00", "workload": family})
    run = {"turns": records}
    pooled = choice.pooled([run], None, [tmp_path])
    only = choice.pooled([run], "memgpt", [tmp_path])
    assert len(pooled) == 4 and len(only) == 2
    assert {t["epic"]["session"] for t in only} == {"memgpt-00"}
    with pytest.raises(SystemExit, match=r"no turn of family 'chat'.*\['memgpt', 'reflexion'\]"):
        choice.pooled([run], "chat", [tmp_path])


def test_several_tuning_runs_pool_and_a_family_is_looked_for_in_all(tmp_path) -> None:
    choice = load_script("reuse/tuned_choice")
    runs = []
    for family, ms in (("memgpt", 30.0), ("reflexion", 70.0)):
        rows = _records({"full": [(100.0, 1.0)] * 2, "epic": [(ms, 1.0)] * 2})
        runs.append({"turns": [{**r, "session": f"{family}-00", "workload": family}
                               for r in rows]})  # fmt: skip
    folders = [tmp_path / "a", tmp_path / "b"]
    assert len(choice.pooled(runs, None, folders)) == 4
    only = choice.pooled(runs, "reflexion", folders)
    assert [t["epic"]["ttft_ms"] for t in only] == [70.0, 70.0]
    with pytest.raises(SystemExit, match=r"no turn of family 'chat'.*\['memgpt', 'reflexion'\]"):
        choice.pooled(runs, "chat", folders)
