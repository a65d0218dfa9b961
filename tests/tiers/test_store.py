"""TieredSegmentStore: placement, spill, dirty pages, checksum misses, recovery, faults."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.kv.store import MissReason, StoredKV, content_id
from agentcache.tiers import MemoryTier, PageData, TierConfig, TieredSegmentStore

M, T = "model", "tok"
TOKEN_BYTES = 2 * 2 * 2 * 4 * 4  # K and V, 2 layers, 2 heads, dim 4, fp32
PAGE = 16 * TOKEN_BYTES


def kv(seed: int, n: int = 48) -> StoredKV:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn((2, n, 2, 4), generator=g)
    return StoredKV(keys, torch.randn((2, n, 2, 4), generator=g), torch.arange(n), M, T, "ctx")


def ids(seed: int) -> list[int]:
    return [seed, seed + 1, seed + 2]


def equal(a: StoredKV | None, b: StoredKV) -> bool:
    assert a is not None
    return all(torch.equal(x, y) for x, y in zip(
        (a.keys, a.values, a.positions), (b.keys, b.values, b.positions), strict=True))  # fmt: skip


def store(
    tmp: Path | None, fast: int, host: int = 0, spill: str = "slide", **options: bool
) -> TieredSegmentStore:
    disk = None if tmp is None else tmp / "disk"
    config = TierConfig(
        fast_bytes=fast, host_bytes=host, disk_dir=disk, spill=spill, fsync=False,
        spill_options=options,
    )  # fmt: skip
    return TieredSegmentStore(config)


def test_fast_only_behaves_like_a_segment_store() -> None:
    s = store(None, fast=10 * PAGE)
    assert s.put(ids(1), kv(1))
    got = s.lookup(M, T, ids(1))
    assert got.hit and equal(got.kv, kv(1)) and got.kv.context_id == "ctx"
    assert s.lookup(M, T, ids(2)).miss is MissReason.NEW
    assert s.lookup("other", T, ids(1)).miss is MissReason.OTHER_MODEL
    assert s.contains_content(M, T, content_id(ids(1), "segment", None))
    # 3 pages each: the fourth segment evicts the least recently used whole segment
    for i in (2, 3, 4):
        s.put(ids(i * 10), kv(i))
    assert s.lookup(M, T, ids(1)).miss is MissReason.EVICTED
    assert s.stats.evictions == 1 and s.tier("fast").counters.pages == 9


def test_spill_to_host_and_disk_and_back_is_exact(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE, host=3 * PAGE)
    for i in range(6):
        assert s.put(ids(i * 10), kv(i))
    c = s.counters()
    assert c["fast"]["pages"] <= 3 and c["host"]["pages"] <= 3 and c["disk"]["pages"] >= 12
    for i in reversed(range(6)):  # newest first: served from fast, then host, then disk
        assert equal(s.lookup(M, T, ids(i * 10)).kv, kv(i))
    c = s.counters()
    assert c["disk"]["hits"] > 0 and c["host"]["hits"] > 0 and c["fast"]["hits"] > 0
    assert s.stats.evictions == 0 and s.tier_stats.failed_spills == 0


def test_clean_pages_are_dropped_not_rewritten_under_slide(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE)
    s.put(ids(0), kv(0))
    s.put(ids(10), kv(1))  # spills segment 0's three pages to disk (new: must be written)
    disk = s.tier("disk").counters
    assert disk.writes == 3 and s.tier_stats.persist_required_bytes == 3 * PAGE
    assert s.lookup(M, T, ids(0)).hit  # back to fast; its disk copy stays: clean
    before = disk.writes
    s.lookup(M, T, ids(10))  # segment 1 comes back from disk: segment 0's clean pages drop
    assert disk.writes == before + 0 and s.tier_stats.dropped_clean == 3


def test_lru_rewrites_clean_pages_page_at_a_time(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE, spill="lru")
    s.put(ids(0), kv(0))
    s.put(ids(10), kv(1))
    disk = s.tier("disk").counters
    assert disk.write_calls == 3  # one call per page
    s.lookup(M, T, ids(0))
    s.lookup(M, T, ids(10))
    assert disk.writes == 9 and s.tier_stats.persist_required_bytes == 6 * PAGE


def mask(*slots: int) -> int:
    return sum(1 << i for i in slots)


def test_dirty_update_is_written_back_and_served(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE)
    s.put(ids(0), kv(0))
    cid = content_id(ids(0), "segment", None)
    new = kv(7)
    page1 = PageData(new.keys[:, 16:32], new.values[:, 16:32], torch.arange(100, 116))
    assert s.update_pages(M, T, cid, {1: (page1, mask(0, 1, 2, 3, 9))})
    s.put(ids(10), kv(1))  # pushes segment 0 down: page 1 is dirty (no copy), written
    got = s.lookup(M, T, ids(0)).kv
    assert got is not None and got.context_id is None  # mixed contexts now
    taken = torch.tensor([16, 17, 18, 19, 25])  # only the masked slots are the new version
    kept = torch.tensor([i for i in range(16, 32) if i not in taken])
    assert torch.equal(got.keys[:, taken], new.keys[:, taken])
    assert torch.equal(got.values[:, taken], new.values[:, taken])
    assert torch.equal(got.keys[:, kept], kv(0).keys[:, kept])
    assert torch.equal(got.keys[:, :16], kv(0).keys[:, :16])
    assert torch.equal(got.positions[taken], torch.tensor([100, 101, 102, 103, 109]))
    assert torch.equal(got.positions[kept], kept)  # the rest keep their stored positions
    # the page is in fast and on disk; a second update makes it dirty by 3 tokens
    assert s.update_pages(M, T, cid, {1: (page1, mask(4, 5, 6))})
    pages = s.page_info(M, T, cid)
    assert [(p.clean, p.dirty_tokens) for p in pages] == [(True, 0), (False, 3), (True, 0)]
    assert s.tier_stats.updates == 2 and s.tier_stats.whole_updates == 0


def test_update_with_a_bad_slot_mask_is_a_clear_error(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE)
    s.put(ids(0), kv(0))
    cid = content_id(ids(0), "segment", None)
    p = PageData(kv(7).keys[:, :16], kv(7).values[:, :16], torch.arange(16))
    for bad in (0, 1 << 16):
        with pytest.raises(ValueError, match="slot mask"):
            s.update_pages(M, T, cid, {0: (p, bad)})
    short = PageData(p.keys[:, :8], p.values[:, :8], p.positions[:8])
    with pytest.raises(ValueError, match="8 tokens"):
        s.update_pages(M, T, cid, {0: (short, 1)})
    assert equal(s.lookup(M, T, ids(0)).kv, kv(0))  # nothing changed


def dirty_then_spill(
    tmp_path: Path, spill: str, **options: bool
) -> tuple[TieredSegmentStore, StoredKV]:
    """Segment 0 on disk and back in fast, two slots of page 1 recomputed, then pushed down
    again; returns the store and segment 0's current version."""
    s = store(tmp_path, fast=3 * PAGE, spill=spill, **options)
    s.put(ids(0), kv(0))
    s.put(ids(10), kv(1))  # segment 0 to disk, whole
    assert s.lookup(M, T, ids(0)).hit  # back in fast, a current copy on disk
    cid = content_id(ids(0), "segment", None)
    new = kv(7)
    page1 = PageData(new.keys[:, 16:32], new.values[:, 16:32], torch.arange(200, 216))
    assert s.update_pages(M, T, cid, {1: (page1, mask(2, 11))})
    old = kv(0)
    want = StoredKV(old.keys, old.values, old.positions, M, T, None)  # mixed contexts now
    for t in (18, 27):
        want.keys[:, t], want.values[:, t] = new.keys[:, t], new.values[:, t]
        want.positions[t] = 200 + t - 16
    s.lookup(M, T, ids(10))  # segment 1 back: segment 0 leaves fast
    return s, want


def test_slide_writes_a_dirty_page_back_as_a_delta_of_its_stale_slots(tmp_path: Path) -> None:
    s, want = dirty_then_spill(tmp_path, "slide")
    disk = s.tier("disk").counters
    assert disk.delta_writes == 1
    assert s.tier_stats.dropped_clean == 2  # pages 0 and 2: current on disk
    assert s.tier_stats.persist_required_bytes == 6 * PAGE + 2 * TOKEN_BYTES
    assert s.tier_stats.persist_required_page_bytes == 7 * PAGE
    assert equal(s.lookup(M, T, ids(0)).kv, want)
    s.demote_all()  # every copy above disk dropped: served from the chain on disk
    assert equal(s.lookup(M, T, ids(0)).kv, want)
    s.close()
    again = TieredSegmentStore(
        TierConfig(fast_bytes=9 * PAGE, disk_dir=tmp_path / "disk", fsync=False)
    )
    assert equal(again.lookup(M, T, ids(0)).kv, want)


@pytest.mark.parametrize(("spill", "options"), [("lru", {}), ("slide", {"deltas": False})])
def test_without_deltas_the_dirty_page_is_written_whole(
    tmp_path: Path, spill: str, options: dict[str, bool]
) -> None:
    s, want = dirty_then_spill(tmp_path, spill, **options)
    assert not s.spill_policy.deltas
    assert s.tier("disk").counters.delta_writes == 0
    assert s.tier_stats.persist_required_bytes == 6 * PAGE + 2 * TOKEN_BYTES  # the same need
    s.demote_all()
    assert equal(s.lookup(M, T, ids(0)).kv, want)


def test_corrupt_page_is_a_checksum_miss_then_recomputed(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE)
    s.put(ids(0), kv(0))
    s.put(ids(10), kv(1))  # segment 0 now only on disk
    for f in (tmp_path / "disk" / "extents").iterdir():
        data = bytearray(f.read_bytes())
        data[10] ^= 0xFF
        f.write_bytes(bytes(data))
    got = s.lookup(M, T, ids(0))
    assert got.miss is MissReason.CHECKSUM and got.kv is None
    assert s.tier("disk").counters.corrupt == 1
    assert not s.contains_content(M, T, content_id(ids(0), "segment", None))
    assert s.put(ids(0), kv(0)) and equal(s.lookup(M, T, ids(0)).kv, kv(0))


def test_restart_serves_persisted_segments(tmp_path: Path) -> None:
    s = store(tmp_path, fast=4 * PAGE)
    for i in range(3):
        s.put(ids(i * 10), kv(i))
    assert s.persist() > 0
    s.close()
    again = store(tmp_path, fast=4 * PAGE)
    assert again.stats.entries == 3
    for i in range(3):
        assert equal(again.lookup(M, T, ids(i * 10)).kv, kv(i))


def test_disk_full_counts_failed_spills_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path, fast=6 * PAGE)
    s.put(ids(0), kv(0))

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s.tier("disk"), "_write_file", full)
    s.put(ids(10), kv(1))
    assert s.put(ids(20), kv(2)) is False  # no room in fast, and disk writes fail
    assert s.tier_stats.failed_spills >= 1 and "No space left" in s.tier_stats.errors[-1]
    assert s.stats.rejected == 1
    assert equal(s.lookup(M, T, ids(0)).kv, kv(0)) and equal(s.lookup(M, T, ids(10)).kv, kv(1))


def test_working_set_check_is_a_clear_error() -> None:
    from agentcache.tiers import TierCapacityError

    with pytest.raises(TierCapacityError, match="working set"):
        TierConfig(fast_bytes=1000).check_working_set(token_bytes=100, tokens=11)
    TierConfig(fast_bytes=1100).check_working_set(token_bytes=100, tokens=11)


@pytest.mark.parametrize(
    ("spill", "options", "needle"),
    [
        ("slide", {"bogus": 1}, "spill_options for 'slide': "),
        ("slide", {"max_extent_pages": 0}, "max_extent_pages must be >= 1"),
        ("lru", {"max_extent_pages": 8}, "LRUSpillPolicy takes no options"),
        ("slide", 8, "spill_options must be a dict of options, got int"),
    ],
    ids=["unknown-option", "bad-value", "no-options", "not-a-dict"],
)
def test_bad_spill_options_fail_when_the_config_is_made(
    spill: str, options: object, needle: str
) -> None:
    from agentcache.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        TierConfig(spill=spill, spill_options=options)  # type: ignore[arg-type]
    assert needle in str(e.value)


def copying(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference path: memory tiers copy on every read and write (no views, no owned
    tensors kept)."""
    monkeypatch.setattr(MemoryTier, "view", MemoryTier.read)
    monkeypatch.setattr(MemoryTier, "_keeps", lambda self, t: False)


def churn(s: TieredSegmentStore, seed: int) -> list[StoredKV | None]:
    """Puts, lookups and dirty updates over more segments than fast and host hold; every
    lookup's K/V, in order."""
    g = torch.Generator().manual_seed(seed)
    served: list[StoredKV | None] = []
    for step in range(60):
        i = int(torch.randint(0, 8, (1,), generator=g))
        if step < 8 or step % 3 == 0:
            s.put(ids(i * 10), kv(i))
        got = s.lookup(M, T, ids(i * 10))
        served.append(got.kv)
        if got.hit and step % 2:
            new = kv(100 + step)
            slots = int(torch.randint(1, 1 << 16, (1,), generator=g))
            page = int(torch.randint(0, 3, (1,), generator=g))
            part = PageData(new.keys[:, 16 * page : 16 * page + 16],
                            new.values[:, 16 * page : 16 * page + 16],
                            torch.arange(500, 516))  # fmt: skip
            s.update_pages(M, T, content_id(ids(i * 10), "segment", None), {page: (part, slots)})
    return served


@pytest.mark.parametrize("spill", ["slide", "lru"])
def test_views_and_owned_writes_serve_what_copying_everywhere_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill: str
) -> None:
    fast = store(tmp_path / "fast", fast=4 * PAGE, host=3 * PAGE, spill=spill)
    served = churn(fast, 7)
    with monkeypatch.context() as m:
        copying(m)
        reference = store(tmp_path / "ref", fast=4 * PAGE, host=3 * PAGE, spill=spill)
        want = churn(reference, 7)
    assert [x is None for x in served] == [x is None for x in want]
    assert sum(x is not None for x in served) > 20
    for a, b in zip(served, want, strict=True):
        if b is not None:
            assert equal(a, b)
    assert fast.counters() == {t: c | {"read_s": fast.counters()[t]["read_s"],
                                       "write_s": fast.counters()[t]["write_s"]}
                               for t, c in reference.counters().items()}  # fmt: skip
    assert fast.tier_stats.updates == reference.tier_stats.updates > 0
    assert fast.tier_stats.spills > 0 and fast.tier("disk").counters.loads > 0


def test_no_caller_tensor_is_aliased_by_the_store(tmp_path: Path) -> None:
    s = store(tmp_path, fast=3 * PAGE, host=3 * PAGE)
    given = kv(1)
    s.put(ids(0), given)
    given.keys.zero_()  # the caller's K/V changes after the put: the store kept a copy
    got = s.lookup(M, T, ids(0)).kv
    assert equal(got, kv(1))
    assert got is not None
    got.keys.zero_()  # a served K/V changed by the caller: the store's pages are apart
    assert equal(s.lookup(M, T, ids(0)).kv, kv(1))
    cid = content_id(ids(0), "segment", None)
    new = kv(9)
    part = PageData(new.keys[:, :16].clone(), new.values[:, :16].clone(), torch.arange(16))
    assert s.update_pages(M, T, cid, {0: (part, (1 << 16) - 1)})
    part.keys.zero_()  # the update's page changed after the call
    after = s.lookup(M, T, ids(0)).kv
    assert after is not None and torch.equal(after.keys[:, :16], new.keys[:, :16])
    # pushed down to host and disk and back: still the same K/V
    s.put(ids(10), kv(2))
    s.put(ids(20), kv(3))
    final = s.lookup(M, T, ids(0)).kv
    assert final is not None and torch.equal(final.keys[:, :16], new.keys[:, :16])
    assert torch.equal(final.keys[:, 16:], kv(1).keys[:, 16:])


def test_a_tier_holds_exactly_the_pages_with_a_copy_there(tmp_path: Path) -> None:
    # spill candidates come from the tier's keys: they must be the pages the store knows
    # to have a copy in that tier
    s = store(tmp_path, fast=4 * PAGE, host=3 * PAGE)
    churn(s, 3)
    assert s.tier_stats.spills > 0
    for tier in s.tiers:
        known = {pk for pk, state in s._placement._pages.items() if tier.name in state.stale}
        assert set(tier.page_keys()) == known and known


def test_owners_stay_bounded_as_segments_come_and_go() -> None:
    """Each evicted segment is remembered for miss diagnostics (EVICTED, OTHER_MODEL) only
    up to the ledger's `memory`; the owners map forgets with it instead of growing forever."""
    s = store(None, fast=6 * PAGE)  # two segments of 3 pages
    s._placement._ledger.memory = 4
    for i in range(40):
        s.put(ids(100 * i), kv(i))
    assert s.stats.evictions == 38
    assert len(s._placement._ledger._evicted) == 4 and len(s._placement._ledger._owners) == 2 + 4
    assert s.lookup(M, T, ids(100 * 37)).miss is MissReason.EVICTED  # still remembered
    assert s.lookup(M, T, ids(0)).miss is MissReason.NEW  # forgotten


@pytest.mark.parametrize(
    "record",
    [None, 5, [], {"cid": 1}, {"cid": "c", "model": M, "tok": T, "context": None},
     {"cid": "c", "model": M, "tok": T, "context": 3, "pages": []},
     {"cid": "c", "model": M, "tok": None, "context": None, "pages": []},
     {"cid": "c", "model": M, "tok": T, "context": None, "pages": "p/0"},
     {"cid": "c", "model": M, "tok": T, "context": None, "pages": [1, 2]}],
)  # fmt: skip
def test_a_malformed_segment_record_on_disk_is_dropped_and_counted(
    tmp_path: Path, record: object
) -> None:
    s = store(tmp_path, fast=12 * PAGE)
    s.put(ids(1), kv(1))
    s.persist()
    s.tier("disk").put_meta("seg:forged", record)
    s.close()
    again = store(tmp_path, fast=12 * PAGE)
    assert again.tier_stats.invalid_records == 1 and again.stats.entries == 1
    assert equal(again.lookup(M, T, ids(1)).kv, kv(1))
    assert "seg:forged" not in again.tier("disk").meta


def test_a_persisted_store_is_never_read_by_other_weights(tmp_path: Path) -> None:
    """The model id is part of every key: after a restart, another model's lookup of the same
    tokens is an OTHER_MODEL miss, never the first model's KV."""
    s = store(tmp_path, fast=12 * PAGE)
    s.put(ids(1), kv(1))
    s.persist()
    s.close()
    again = store(tmp_path, fast=12 * PAGE)
    assert again.lookup("model#other-weights", T, ids(1)).miss is MissReason.OTHER_MODEL
    assert equal(again.lookup(M, T, ids(1)).kv, kv(1))
