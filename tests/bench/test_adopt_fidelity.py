from __future__ import annotations

from typing import Any

from tests.bench.scripts import load_script


def rec(session: str, turn: int, strategy: str, kl: float, exact: float) -> dict[str, Any]:
    return {"session": session, "workload": session.split("-")[0], "turn": turn,
            "strategy": strategy, "kl_first_token": kl, "tf_kl": kl,
            "greedy_exact_match": exact}  # fmt: skip


def test_compare_pairs_turns_from_2_on_per_workload_and_overall() -> None:
    f = load_script("tiers/adopt_fidelity")
    records = [
        rec("w-01", 1, "rpdc", 9.0, 0.0),  # turn 1: the same in both runs, left out
        rec("w-01", 1, "rpdc+adopt", 0.0, 1.0),
        rec("w-01", 2, "rpdc", 1e-3, 1.0),
        rec("w-01", 2, "rpdc+adopt", 3e-3, 0.0),
        rec("w-01", 3, "rpdc", 2e-3, 1.0),
        rec("w-01", 3, "rpdc+adopt", 1e-3, 1.0),
        rec("w-01", 2, "full", 0.0, 1.0),
    ]
    text = f.compare(records, "rpdc")
    lines = text.splitlines()
    assert lines[2] == ("| w | 2 | 1.50e-03 / 2.00e-03 | 1.50e-03 / 2.00e-03 | 1.00 / 0.50 "
                        "| 1 of 2 | 1.75 |")  # fmt: skip
    assert lines[3].startswith("| all | 2 |") and len(lines) == 4
