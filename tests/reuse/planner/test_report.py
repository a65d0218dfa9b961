"""The planner report on synthetic records: the oracle is the fastest fixed strategy that
meets the floor; calibration counts turns whose measured KL is under the prediction."""

from __future__ import annotations

from typing import Any

import pytest

from agentcache.bench.reuse.planner.calibration import replay_choices
from agentcache.bench.reuse.planner.data import PlanRow
from agentcache.bench.reuse.planner.report import Rates, calibration, family_rows, plan_choices
from agentcache.reuse.planner.candidates import PlanSignals
from agentcache.reuse.planner.choice import Floor
from tests.reuse.planner.conftest import predictor_for


def rec(strategy: str, turn: int, ttft: float, greedy: float = 1.0, **kw: Any) -> dict[str, Any]:
    base = {"session": "s", "workload": "w", "turn": turn, "strategy": strategy}
    return base | {"ttft_ms": ttft, "greedy_exact_match": greedy, "first_token_agreement": 1.0,
                   "tf_kl": 1e-5} | kw  # fmt: skip


def test_oracle_is_the_fastest_fixed_strategy_meeting_the_floor() -> None:
    records = []
    for t in (1, 2):
        records += [rec("full", t, 100.0), rec("prefix", t, 80.0), rec("epic", t, 60.0),
                    rec("pic", t, 30.0, greedy=0.0)]  # fmt: skip
        records.append(rec("plan", t, 50.0, plan="epic", plan_exact=False, plan_unpredicted=None,
                           predicted_kl_first_token=1e-4, predicted_tf_kl=1e-6,
                           kl_first_token=1e-5))  # fmt: skip
    (row,) = family_rows(records, "prefix", Rates())
    assert row["oracle"]["label"] == "epic"  # pic is faster but misses the floor
    assert row["plan"]["vs_full"] == pytest.approx(0.5)
    assert row["plan_vs_oracle"] == pytest.approx(50 / 60)
    assert row["tuned"]["vs_prefix"] == pytest.approx(1.0)
    assert plan_choices(records)["w"]["epic"] == 2
    first, tf = calibration(records)
    assert first["covered"] == 1.0 and tf["covered"] == 0.0  # tf: 1e-5 measured > 1e-6


def test_replay_takes_the_chosen_plans_record_and_counts_exact_stand_ins() -> None:
    """A replay judges a choice by the stored record of the chosen plan; `exact`, which no
    stored run measured, by prefix's."""
    p = predictor_for("m", kl_log10=-5.0)  # approximate plans predict 1e-5
    pic = PlanSignals("pic", 1000, 100, 900, 500, 500, 3.0, False, 0.1)
    prefix = PlanSignals("prefix", 1000, 700, 300, 0, 0, 0.0, False, 0.7)
    exact = PlanSignals("exact", 1000, 600, 900, 500, 0, 3.0, False, 0.6)
    turn = {"pic": pic, "prefix": prefix, "exact": exact}  # the replay's, every plan
    rows = [
        PlanRow("w", "s", 1, "pic", pic, rec("pic", 1, 30.0, ttft_full_ms=100.0), turn),
        PlanRow("w", "s", 1, "prefix", prefix, rec("prefix", 1, 70.0, ttft_full_ms=100.0), turn),
    ]
    (loose,) = replay_choices(p, rows, Floor("kl", 1e-3, 1e-3), 0.02)
    assert loose["plans"] == {"pic": 1} and loose["vs_full"] == pytest.approx(0.3)
    (strict,) = replay_choices(p, rows, Floor("exact", 0.0, 0.0), 0.02)
    assert strict["plans"] == {"exact": 1} and strict["stand_ins"] == 1  # exact: 0.6 < 0.7
    assert strict["vs_full"] == pytest.approx(0.7)  # judged by prefix's record
