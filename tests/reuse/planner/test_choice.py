"""The planner's rule on synthetic estimates: the cheapest plan meeting the floor."""

from __future__ import annotations

import pytest

from agentcache.errors import ConfigError
from agentcache.reuse.planner.choice import EXACT_FLOOR, Estimate, Floor, check_fidelity, choose

HIGH = Floor("high", 1e-4, 3e-5)
EXACT = Estimate("exact", True, 0.60, 0.0, 0.0)
PREFIX = Estimate("prefix", True, 0.70, 0.0, 0.0)


def test_cheapest_plan_meeting_the_floor() -> None:
    epic = Estimate("epic", False, 0.40, 5e-5, 1e-5)
    pic = Estimate("pic", False, 0.30, 2e-3, 1e-3)  # cheaper, predicted past the floor
    assert choose([EXACT, PREFIX, epic, pic], HIGH, 0.02).plan == "epic"
    loose = Floor("kl=0.01", 1e-2, 1e-2)
    assert choose([EXACT, PREFIX, epic, pic], loose, 0.02).plan == "pic"


def test_exact_floor_takes_the_cheapest_exact_plan() -> None:
    epic = Estimate("epic", False, 0.10, 0.0 + 1e-9, 1e-9)
    assert choose([PREFIX, EXACT, epic], EXACT_FLOOR, 0.0).plan == "exact"


def test_an_approximate_plan_must_save_more_than_min_gain() -> None:
    """Its predicted cost counts the probe it runs: a probe plan whose compute saving the
    probe eats up is not taken over an exact plan."""
    probe = Estimate("probe", False, 0.59, 1e-6, 1e-6)  # 0.01 under exact: within min_gain
    assert choose([EXACT, probe], HIGH, 0.02).plan == "exact"
    assert choose([EXACT, probe], HIGH, 0.0).plan == "probe"


def test_a_plan_exact_on_this_turn_needs_no_prediction() -> None:
    epic_exact = Estimate("epic", True, 0.50, 0.0, 0.0)
    assert choose([EXACT, epic_exact], EXACT_FLOOR, 0.02).plan == "epic"


def test_ties_go_to_the_earlier_exact_plan() -> None:
    same = Estimate("prefix", True, 0.60, 0.0, 0.0)
    assert choose([EXACT, same], HIGH, 0.0).plan == "exact"


def test_no_exact_plan_is_an_error() -> None:
    with pytest.raises(ValueError, match="no exact plan"):
        choose([Estimate("pic", False, 0.3, 0.0, 0.0)], HIGH, 0.0)


@pytest.mark.parametrize(
    ("fidelity", "kl", "message"),
    [("perfect", 0.0, "fidelity must be one of"), ("high", -1.0, "kl must be in"),
     ("high", 2.0, "kl must be in")],
)  # fmt: skip
def test_bad_fidelity(fidelity: str, kl: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_fidelity(fidelity, kl)
