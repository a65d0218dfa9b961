"""Retention times from requests and learned from tool-pause gaps; the pin table's cap."""

from __future__ import annotations

import pytest

from agentcache.kv.retention import GapLearner, PinTable, RetentionConfig, parse_retention


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), (2.5, 2.5), ("30s", 30.0), ("5m", 300.0), ("250ms", 0.25), ("1.5h", 5400.0),
     ("2min", 120.0), ("45", 45.0), (0, 0.0)],
)  # fmt: skip
def test_retention_times_parse(value: object, seconds: float) -> None:
    assert parse_retention(value, "retention", max_s=6000) == seconds


@pytest.mark.parametrize(
    ("value", "problem"),
    [(-1, "negative"), ("-5s", "not a duration"), ("soon", "not a duration"),
     ("5 days", "not a duration"), (None, "not a duration"), (True, "not a finite"),
     (float("inf"), "not a finite"), (float("nan"), "not a finite"),
     ("2h", "above the server's cap")],
)  # fmt: skip
def test_a_bad_retention_time_is_a_value_error_naming_the_field(
    value: object, problem: str
) -> None:
    with pytest.raises(ValueError) as e:
        parse_retention(value, "cache.retention", max_s=600)
    assert str(e.value).startswith("cache.retention: ") and problem in str(e.value)


def test_retention_config_is_checked() -> None:
    with pytest.raises(ValueError, match="default_s"):
        RetentionConfig(default_s=700, max_s=600)
    with pytest.raises(ValueError, match="pinned_share"):
        RetentionConfig(pinned_share=1.5)


def test_the_learned_retention_covers_most_gaps_and_is_capped() -> None:
    learner = GapLearner(RetentionConfig(default_s=60, max_s=100, quantile=0.9), min_gaps=4)
    for gap in (1.0, 2.0, 3.0):
        learner.observe(gap)
    assert learner.retention_s() == 60  # too few gaps seen
    for gap in (4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
        learner.observe(gap)
    assert learner.retention_s() == 9.0  # the 9th of 10 sorted gaps
    learner.observe(-1.0)  # not a gap: ignored
    for _ in range(40):
        learner.observe(500.0)
    assert learner.retention_s() == 100  # capped


def test_pins_stay_under_the_cap_refuse_by_name_and_expire_at_once() -> None:
    table = PinTable(max_bytes=100)
    got = table.pin([("a", 60), ("b", 50), ("c", 40)], seconds=10, now=0)
    assert got.pinned == ("a", "c") and got.refused == ("b",) and got.until == 10
    assert table.pinned_bytes(now=5) == 100 and table.refused == 1
    assert table.is_pinned("a", now=9.9) and not table.is_pinned("a", now=10)
    assert table.pinned_bytes(now=10) == 0  # expired: counts nowhere, evictable at once
    assert table.pin([("b", 50)], seconds=5, now=10).pinned == ("b",)


def test_a_pin_is_extended_never_shortened() -> None:
    table = PinTable(max_bytes=100)
    table.pin([("a", 10)], seconds=30, now=0)
    table.pin([("a", 10)], seconds=5, now=1)
    assert table.is_pinned("a", now=29)
    table.pin([("a", 10)], seconds=60, now=2)
    assert table.is_pinned("a", now=61)
    table.unpin(["a"])
    assert not table.is_pinned("a", now=3)
