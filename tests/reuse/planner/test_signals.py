"""Where a plan's left-out tokens sit (`reach`, `fresh`), and the signal study's folds."""

from __future__ import annotations

import pytest
import torch

from agentcache.bench.reuse.planner.data import PlanRow
from agentcache.bench.reuse.planner.signals import cross_validate
from agentcache.reuse.planner.candidates import PlanSignals, _where


def test_reach_and_fresh_count_around_the_last_left_out_token() -> None:
    left = torch.tensor([0, 0, 1, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    reused = torch.tensor([0, 1, 1, 1, 0, 1, 1, 1, 0, 0], dtype=torch.bool)
    # last left-out token at 5: 4 tokens after it; before it, 0 and 4 are not reused
    assert _where(left, reused) == (4, 2)
    assert _where(torch.zeros(10, dtype=torch.bool), reused) == (0, 0)


def _row(family: str, session: int, turn: int, plan: str, left: int, kl: float) -> PlanRow:
    work = 1.0 - left / 1000
    s = PlanSignals(plan, 1000, 1000 - left, 900, 500 if left else 0, left, 10.0, False, work)
    record = {"kl_first_token": kl, "tf_kl": kl, "greedy_exact_match": 1.0,
              "first_token_agreement": 1.0, "ttft_ms": 1000.0 - left,
              "ttft_full_ms": 1000.0}  # fmt: skip
    return PlanRow(family, f"{family}-{session:02d}", turn, plan, s, record)


def test_held_out_turns_are_judged_by_a_fit_that_never_saw_them() -> None:
    rows = [
        r
        for fam in ("a", "b")
        for sess in range(4)
        for turn in range(1, 4)
        for r in (
            _row(fam, sess, turn, "prefix", 0, 0.0),
            _row(fam, sess, turn, "pic", 400 + 10 * turn + sess, 1e-5 if fam == "a" else 1e-3),
        )
    ]
    by_family = cross_validate(rows, "base", "family", 0.9)
    assert [h.family for h in by_family] == ["a", "b"]
    assert all(h.turns == 12 for h in by_family)
    # fitted on b's high KLs alone, a's turns are covered; fitted on a's, b's are not
    assert by_family[0].covered == 1.0 and by_family[1].covered == 0.0
    assert {h.family for h in cross_validate(rows, "base", "session", 0.9)} == {"a", "b"}
    with pytest.raises(ValueError, match="split must be"):
        cross_validate(rows, "base", "turn", 0.9)
