"""Retention times from requests and learned from tool-pause gaps; the pin table's cap; the
memory store's retention (skipped by eviction, within its share, per scope); the pause book."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.retention import (
    GapLearner,
    PauseBook,
    PinTable,
    RetentionConfig,
    RetentionStats,
    parse_retention,
)
from agentcache.kv.store import MissReason
from agentcache.tiers.config import TierConfig
from agentcache.tiers.store import TieredSegmentStore
from tests.kv.test_store_contract import ENTRY, PAGE_SIZE, M, T, cid, entry


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


def test_an_owner_holds_at_most_its_part_of_the_cap_and_another_still_pins() -> None:
    table = PinTable(max_bytes=100, owner_share=0.4)  # an owner's part: 40 bytes
    got = table.pin([("a1", 30), ("a2", 10), ("a3", 10)], seconds=10, now=0, owner="A")
    assert got.pinned == ("a1", "a2") and got.refused == got.owner_refused == ("a3",)
    assert table.owner_bytes("A", now=1) == 40 and (table.refused, table.owner_refused) == (1, 1)
    assert table.pin([("a1", 30)], seconds=20, now=1, owner="A").pinned == ("a1",)  # no growth
    got = table.pin([("b1", 30), ("b2", 20)], seconds=10, now=1, owner="B")
    assert got.pinned == ("b1",) and got.owner_refused == ("b2",)  # B gets its own part
    got = table.pin([("c1", 40)], seconds=10, now=1, owner="C")
    assert got.refused == ("c1",) and got.owner_refused == ()  # the table's cap, not C's part
    assert table.stats(now=1) == RetentionStats(3, 70, 100, 3, 2)
    assert table.pin([("x", 10)], seconds=10, now=1).pinned == ("x",)  # no owner: no part
    assert table.pin([("a3", 10)], seconds=10, now=10, owner="A").pinned == ("a3",)  # a2 expired


def test_an_owner_under_its_reservation_ends_pins_beyond_the_others_reservations() -> None:
    """A full table: B (nothing pinned, a reservation of 25 bytes) gets room by ending A's
    pins beyond A's own 25, soonest to expire first; never A's reservation, never for a pin
    beyond B's; and nothing is ended when that would not make room. The reference without
    reservations refuses B."""
    for reserve in (0.25, 0.0):
        table = PinTable(max_bytes=100, owner_share=1.0, owner_reserve=reserve)
        table.pin([("a1", 20), ("a2", 20)], seconds=30, now=0, owner="A")
        table.pin([("a3", 20), ("a4", 20), ("a5", 20)], seconds=10, now=0, owner="A")
        got = table.pin([("b1", 15)], seconds=60, now=1, owner="B")
        if reserve == 0.0:
            assert got.pinned == () and got.refused == ("b1",) and got.preempted == ()
            continue
        assert got.pinned == ("b1",) and got.preempted == ("a3",)  # expires first (t=10)
        assert not table.is_pinned("a3", now=2) and table.is_pinned("a1", now=2)
        # B's second pin takes it to 30 > its 25: beyond its reservation, no preemption
        got = table.pin([("b2", 15)], seconds=60, now=1, owner="B")
        assert got.refused == ("b2",) and got.preempted == ()
        # C and D within theirs: each ends one more of A's (95 + 25 and 100 + 20 bytes)
        got = table.pin([("c1", 25)], seconds=60, now=1, owner="C")
        assert got.pinned == ("c1",) and got.preempted == ("a4",)
        got = table.pin([("d1", 20)], seconds=60, now=1, owner="D")
        assert got.pinned == ("d1",) and got.preempted == ("a5",)
        # E: A holds 40, and ending 20 more would take it under its 25; B, C and D are
        # within theirs: refused, nothing ended
        got = table.pin([("e1", 20)], seconds=60, now=1, owner="E")
        assert got.refused == ("e1",) and got.preempted == ()
        assert table.owner_bytes("A", now=2) == 40 >= table.owner_reserve_bytes
        assert table.pinned_bytes(now=2) == 100
        assert table.stats(now=2).preempted == 3 == table.preempted


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def memory_store(clock: Clock, entries: int = 4, share: float = 0.5) -> MemorySegmentStore:
    return MemorySegmentStore(entries * ENTRY, retain_share=share, clock=clock)


def test_a_retained_entry_is_skipped_by_eviction_until_it_expires() -> None:
    clock = Clock()
    s = memory_store(clock)
    for n in range(4):
        assert s.put_content(cid(n), entry(float(n)))
    got = s.retain(M, T, [cid(0)], seconds=30)
    assert len(got.pinned) == 1 and got.nbytes == ENTRY and got.until == 30
    s.put_content(cid(4), entry(4.0))  # LRU would take 0: 1 goes instead
    assert s.lookup_content(M, T, cid(0)).hit
    assert s.lookup_content(M, T, cid(1)).miss is MissReason.EVICTED
    assert s.stats.evictions == 1
    clock.now = 30.0  # expired: evictable at once, no timer
    assert s.retention_stats() == RetentionStats(0, 0, 2 * ENTRY, 0)
    for n in (5, 6, 7, 8):
        s.put_content(cid(n), entry(float(n)))
    assert s.lookup_content(M, T, cid(0)).miss is MissReason.EVICTED


def test_retained_bytes_stay_within_the_share_and_a_put_never_evicts_a_pin() -> None:
    clock = Clock()
    s = memory_store(clock, share=0.5)  # two of four entries may be retained
    for n in range(4):
        s.put_content(cid(n), entry(float(n)))
    got = s.retain(M, T, [cid(0), cid(1), cid(2), cid(9)], seconds=30)
    assert len(got.pinned) == 2 and len(got.refused) == 2  # the cap, and 9 not held
    assert s.retention_stats() == RetentionStats(2, 2 * ENTRY, 2 * ENTRY, 1)
    for n in range(10, 20):  # churn: only the two unretained slots turn over
        assert s.put_content(cid(n), entry(float(n)))
        assert s.retention_stats().pinned_bytes <= 2 * ENTRY
    assert s.lookup_content(M, T, cid(0)).hit and s.lookup_content(M, T, cid(1)).hit
    s.set_retain_share(1.0)
    s.retain(M, T, [cid(18), cid(19)], seconds=30)
    assert not s.put_content(cid(20), entry(20.0))  # every entry retained: rejected
    assert s.stats.rejected == 1 and s.lookup_content(M, T, cid(18)).hit
    s.release(M, T, [cid(18)])
    assert s.put_content(cid(20), entry(20.0))
    assert s.lookup_content(M, T, cid(18)).miss is MissReason.EVICTED


def test_a_pin_in_one_scope_protects_nothing_in_another() -> None:
    clock = Clock()
    s = memory_store(clock, entries=2, share=0.5)
    s.put_content(cid(0, "tenant-a"), entry(0.0))
    s.put_content(cid(0, "tenant-b"), entry(0.0))  # the same tokens, another scope
    got = s.retain(M, T, [cid(0, "tenant-a")], seconds=30)
    assert len(got.pinned) == 1
    s.put_content(cid(1), entry(1.0))
    assert s.lookup_content(M, T, cid(0, "tenant-a")).hit
    assert s.lookup_content(M, T, cid(0, "tenant-b")).miss is MissReason.EVICTED


def test_a_pause_is_resumed_once_by_any_of_its_keys_and_the_book_is_bounded() -> None:
    book: PauseBook[str] = PauseBook(max_pauses=2)
    book.pause([("t", "fp1"), ("t", "conv1")], "one", now=1.0)
    assert book.resume([("u", "fp1")], now=2.0) is None  # another tenant's key
    assert book.resume([("t", "x"), ("t", "conv1")], now=4.5) == (3.5, "one")
    assert book.resume([("t", "fp1")], now=5.0) is None  # resumed once
    for n in range(3):
        book.pause([("t", f"fp{n}")], str(n), now=float(n))
    assert len(book) == 2 and book.resume([("t", "fp0")], now=9.0) is None  # the oldest left
    book.pause([("t", "fp2")], "again", now=10.0)  # a key waiting again: the newest pause
    assert book.resume([("t", "fp2")], now=12.0) == (2.0, "again")


# ---- the RetainingStore contract, over every store that retains ----

RETAINING = ["memory", "tiered-memory", "tiered-disk"]


@pytest.fixture(params=RETAINING)
def retaining(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Clock]]:
    """A store of four entries (the tiered-disk one: two in fast, four on disk) on a clock."""
    clock = Clock()
    store: MemorySegmentStore | TieredSegmentStore
    if request.param == "memory":
        store = MemorySegmentStore(4 * ENTRY, clock=clock)
    elif request.param == "tiered-memory":
        store = TieredSegmentStore(TierConfig(fast_bytes=4 * ENTRY, page_size=PAGE_SIZE),
                                   clock=clock)  # fmt: skip
    else:
        config = TierConfig(fast_bytes=2 * ENTRY, disk_dir=tmp_path, disk_bytes=4 * ENTRY,
                            page_size=PAGE_SIZE, fsync=False)  # fmt: skip
        store = TieredSegmentStore(config, clock=clock)
    store.set_retain_share(0.5)
    yield store, clock
    if isinstance(store, TieredSegmentStore):
        store.close()


def test_contract_a_retained_entry_outlives_pressure_until_it_expires(
    retaining: tuple[Any, Clock],
) -> None:
    s, clock = retaining
    s.put_content(cid(0), entry(0.0))
    assert len(s.retain(M, T, [cid(0)], seconds=10).pinned) == 1
    for n in range(1, 12):
        assert s.put_content(cid(n), entry(float(n)))
    assert s.lookup_content(M, T, cid(0)).hit  # LRU's first victim, eleven times over
    clock.now = 10.0
    for n in range(12, 24):
        s.put_content(cid(n), entry(float(n)))
    assert s.lookup_content(M, T, cid(0)).miss is MissReason.EVICTED


def test_contract_retained_bytes_never_exceed_the_share(retaining: tuple[Any, Clock]) -> None:
    s, _ = retaining
    cap = s.retention_stats().max_bytes
    assert cap > 0
    for n in range(8):
        s.put_content(cid(n), entry(float(n)))
        s.retain(M, T, [cid(n)], seconds=60)
        assert s.retention_stats().pinned_bytes <= cap
    assert s.retention_stats().refused > 0


def test_contract_a_pin_protects_its_scope_only_and_release_ends_it(
    retaining: tuple[Any, Clock],
) -> None:
    s, _ = retaining
    s.put_content(cid(0, "a"), entry(0.0))
    s.put_content(cid(0, "b"), entry(0.0))
    assert s.retain(M, T, [cid(0, "a")], seconds=60).pinned
    for n in range(1, 8):
        s.put_content(cid(n), entry(float(n)))
    assert s.lookup_content(M, T, cid(0, "a")).hit
    assert s.lookup_content(M, T, cid(0, "b")).miss is MissReason.EVICTED
    s.release(M, T, [cid(0, "a")])
    assert s.retention_stats().pinned_entries == 0
    for n in range(8, 16):
        s.put_content(cid(n), entry(float(n)))
    assert s.lookup_content(M, T, cid(0, "a")).miss is MissReason.EVICTED


def test_contract_one_owner_holds_at_most_its_part_and_another_still_pins(
    retaining: tuple[Any, Clock],
) -> None:
    s, _ = retaining
    s.set_retain_share(1.0, owner_share=0.5)
    part = s.retention_stats().max_bytes // 2
    for n in range(4):
        s.put_content(cid(n, "a"), entry(float(n)))
        s.retain(M, T, [cid(n, "a")], seconds=60, owner="A")
    stats = s.retention_stats()
    assert 0 < stats.pinned_bytes <= part
    assert stats.owner_refused > 0 and stats.owner_refused == stats.refused
    s.put_content(cid(0, "b"), entry(0.0))
    got = s.retain(M, T, [cid(0, "b")], seconds=60, owner="B")
    assert len(got.pinned) == 1 and got.owner_refused == ()
    with pytest.raises(ValueError, match="owner_share"):
        s.set_retain_share(0.5, owner_share=0.0)


def test_contract_an_owner_under_its_reservation_ends_pins_beyond_anothers(
    retaining: tuple[Any, Clock],
) -> None:
    """A fills the whole share; B, under its reservation, gets a pin by ending A's soonest to
    expire; that entry is then evictable, A's other pins are not."""
    s, _ = retaining
    s.set_retain_share(1.0)
    share = min(1.0, (2 * ENTRY + 1) / s.retention_stats().max_bytes)  # two entries' worth
    s.set_retain_share(share, owner_share=1.0, owner_reserve=0.5)  # an entry each
    cap = s.retention_stats().max_bytes
    assert s.put_content(cid(0, "b"), entry(0.0))  # stored before A's pins fill the share
    n = 0
    while s.retention_stats().pinned_bytes + ENTRY <= cap:
        s.put_content(cid(n, "a"), entry(float(n)))
        assert s.retain(M, T, [cid(n, "a")], seconds=60 - n, owner="A").pinned
        n += 1
    assert n >= 2
    got = s.retain(M, T, [cid(0, "b")], seconds=60, owner="B")
    assert len(got.pinned) == 1 and len(got.preempted) == 1  # A's last: the soonest expiry
    assert s.retention_stats().preempted == 1 and s.retention_stats().pinned_bytes <= cap
    s.release(M, T, [cid(0, "b")])
    for k in range(100, 116):  # pressure: the ended pin's entry goes, A's others stay
        s.put_content(cid(k), entry(float(k)))
    assert s.lookup_content(M, T, cid(n - 1, "a")).miss is MissReason.EVICTED
    assert all(s.lookup_content(M, T, cid(k, "a")).hit for k in range(n - 1))
    with pytest.raises(ValueError, match="owner_reserve"):
        s.set_retain_share(0.5, owner_share=0.5, owner_reserve=0.6)
