"""Retention in the tiered store: a retained conversation's segments survive the pressure
that evicts others, stay in fast within the retained share, expire at once, and come back
up to fast by prefetch."""

from __future__ import annotations

from pathlib import Path

from agentcache.kv.retention import RetentionStats
from agentcache.kv.store import MissReason, content_id
from agentcache.tiers import TierConfig, TieredSegmentStore
from tests.tiers.test_store import PAGE, M, T, equal, ids, kv


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cid(seed: int) -> str:
    return content_id(ids(seed), "segment", None)


def store(clock: Clock, fast: int, host: int = 0, disk: Path | None = None,
          share: float = 0.5) -> TieredSegmentStore:  # fmt: skip
    config = TierConfig(fast_bytes=fast, host_bytes=host, disk_dir=disk, fsync=False,
                        retain_share=share)  # fmt: skip
    return TieredSegmentStore(config, clock=clock)


def test_a_retained_segment_is_not_evicted_until_it_expires() -> None:
    clock = Clock()
    s = store(clock, fast=10 * PAGE)  # 3 segments of 3 pages; 5 pages may be retained
    s.put(ids(1), kv(1))
    got = s.retain(M, T, [cid(1)], seconds=30)
    assert len(got.pinned) == 1 and got.refused == () and got.until == 30
    for i in (2, 3, 4):  # without the retention the 4th put evicts segment 1 (LRU)
        s.put(ids(i), kv(i))
    assert equal(s.lookup(M, T, ids(1)).kv, kv(1))
    assert s.lookup(M, T, ids(2)).miss is MissReason.EVICTED
    clock.now = 30.0  # expired: evictable at once, in its LRU turn
    for i in (5, 6, 7):  # segments 3, 4, then 1 (the lookup above made it newer)
        s.put(ids(i), kv(i))
    assert s.lookup(M, T, ids(1)).miss is MissReason.EVICTED
    assert s.stats.evictions == 4


def test_retained_bytes_stay_within_the_share_and_the_rest_is_refused() -> None:
    clock = Clock()
    s = store(clock, fast=10 * PAGE)
    for i in (1, 2):
        s.put(ids(i), kv(i))
    got = s.retain(M, T, [cid(1), cid(2), cid(9)], seconds=30)  # 6 pages > 5; 9 not stored
    assert len(got.pinned) == 1 and len(got.refused) == 2


def test_a_retained_segment_stays_in_fast_while_others_spill_and_prefetch_brings_one_up(
    tmp_path: Path,
) -> None:
    clock = Clock()
    s = store(clock, fast=6 * PAGE, host=30 * PAGE, disk=tmp_path / "disk")
    s.put(ids(1), kv(1))
    s.retain(M, T, [cid(1)], seconds=60)
    for i in (2, 3, 4):
        s.put(ids(i), kv(i))
    fast = s.tier("fast")
    seg1 = [p.key for p in s.page_info(M, T, cid(1))]
    assert len(seg1) == 3 and all(k in fast for k in seg1)  # segment 1 never left fast
    assert fast.counters.pages == 6
    before = s.tier("host").counters.hits
    moved = s.prefetch(M, T, [cid(2)])
    assert moved == 3 and s.tier_stats.prefetched_pages == 3
    assert s.tier("host").counters.hits == before  # a prefetch is not a hit
    assert all(p.key in fast for p in s.page_info(M, T, cid(2)))
    loads = s.tier("host").counters.loads
    assert equal(s.lookup(M, T, ids(2)).kv, kv(2))
    assert s.tier("host").counters.loads == loads  # served from fast: no read below
    assert equal(s.lookup(M, T, ids(1)).kv, kv(1))
    assert s.prefetch(M, T, [cid(2), cid(99)]) == 0  # already up; unknown: skipped
    s.close()


def test_a_released_or_reshared_retention_and_its_stats() -> None:
    clock = Clock()
    s = store(clock, fast=10 * PAGE, share=0.5)
    for i in (1, 2):
        s.put(ids(i), kv(i))
    got = s.retain(M, T, [cid(1)], seconds=30)
    assert got.nbytes == 3 * PAGE
    assert s.retention_stats() == RetentionStats(1, 3 * PAGE, 5 * PAGE, 0)
    s.set_retain_share(0.2)  # two pages: segment 2 (three) no longer fits
    assert s.retain(M, T, [cid(2)], seconds=30).refused != ()
    s.release(M, T, [cid(1)])
    assert s.retention_stats().pinned_bytes == 0
    for i in (3, 4):  # segment 1 released: LRU evicts it
        s.put(ids(i), kv(i))
    assert s.lookup(M, T, ids(1)).miss is MissReason.EVICTED
