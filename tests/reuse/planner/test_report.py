"""The planner report on synthetic records: the oracle is the fastest fixed strategy that
meets the floor; calibration counts turns whose measured KL is under the prediction."""

from __future__ import annotations

from typing import Any

import pytest

from agentcache.bench.planner_report import Rates, calibration, family_rows, plan_choices


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
