"""The Tier contract, run over every tier implementation."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import agentcache.tiers.disk as disk_mod
from agentcache.tiers import DiskTier, MemoryTier, PageData, PageKey, Tier, TierError


def page(seed: int, n: int = 16) -> PageData:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn((2, n, 2, 4), generator=g)
    return PageData(keys, torch.randn((2, n, 2, 4), generator=g), torch.arange(seed, seed + n))


PAGE_BYTES = page(0).nbytes


def same(a: PageData | None, b: PageData) -> bool:
    assert a is not None
    return all(torch.equal(x, y) for x, y in zip(
        (a.keys, a.values, a.positions), (b.keys, b.values, b.positions), strict=True))  # fmt: skip


def memory(tmp: Path, capacity: int) -> Tier:
    return MemoryTier("host", capacity)


def disk(tmp: Path, capacity: int) -> Tier:
    return DiskTier(tmp / "disk", capacity, fsync=False)


TIERS: list[Callable[[Path, int], Tier]] = [memory, disk]


@pytest.fixture(params=TIERS, ids=lambda f: f.__name__)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[int], Tier]:
    return lambda capacity: request.param(tmp_path, capacity)


def test_write_read_roundtrip_counts_one_call_per_extent(make: Callable[[int], Tier]) -> None:
    tier = make(10 * PAGE_BYTES)
    pages = [(PageKey(f"s/{i}"), page(i)) for i in range(3)]
    tier.write(pages)
    c = tier.counters
    assert (c.writes, c.write_calls, c.pages, c.bytes) == (3, 1, 3, 3 * PAGE_BYTES)
    assert c.bytes_written >= 3 * PAGE_BYTES and c.write_s >= 0.0
    for key, p in pages:
        assert key in tier and same(tier.read(key), p)
    assert c.loads == 3 and c.read_s > 0.0
    assert tier.read(PageKey("absent")) is None and c.corrupt == 0 and c.loads == 3


def test_read_returns_copies_the_tier_keeps_no_alias(make: Callable[[int], Tier]) -> None:
    tier = make(4 * PAGE_BYTES)
    original = page(1)
    given = PageData(original.keys.clone(), original.values.clone(), original.positions.clone())
    tier.write([(PageKey("a/0"), given)])
    given.keys.zero_()
    got = tier.read(PageKey("a/0"))
    assert got is not None and same(got, original)
    got.keys.zero_()
    assert same(tier.read(PageKey("a/0")), original)


def test_a_view_reads_the_page_and_is_never_changed_by_the_tier(
    make: Callable[[int], Tier],
) -> None:
    tier = make(4 * PAGE_BYTES)
    tier.write([(PageKey("a/0"), page(1))])
    seen = tier.view(PageKey("a/0"))
    assert same(seen, page(1)) and tier.counters.loads == 1
    tier.write([(PageKey("a/0"), page(3))])  # a replacement: new tensors, the old untouched
    assert same(seen, page(1)) and same(tier.view(PageKey("a/0")), page(3))
    tier.drop([PageKey("a/0")])
    assert same(seen, page(1)) and tier.view(PageKey("a/0")) is None


def test_an_owned_write_stores_the_page(make: Callable[[int], Tier]) -> None:
    tier = make(4 * PAGE_BYTES)
    tier.write([(PageKey("a/0"), page(1))], owned=True)
    assert same(tier.read(PageKey("a/0")), page(1)) and tier.counters.bytes == PAGE_BYTES


def test_memory_keeps_owned_tensors_but_copies_views_into_larger_ones() -> None:
    tier = MemoryTier("fast", 4 * PAGE_BYTES)
    given = page(1)
    tier.write([(PageKey("a/0"), given)], owned=True)
    kept = tier.view(PageKey("a/0"))
    assert kept is not None and kept.keys is given.keys and kept.values is given.values
    big = page(2, n=32)  # the first 16 tokens: a view that would keep all 32 alive
    part = PageData(big.keys[:, :16], big.values[:, :16], big.positions[:16])
    tier.write([(PageKey("a/1"), part)], owned=True)
    copied = tier.view(PageKey("a/1"))
    assert copied is not None and same(copied, part)
    assert copied.keys.untyped_storage().nbytes() == copied.keys.nbytes
    # not owned: always a copy
    tier.write([(PageKey("a/2"), given)])
    assert tier.view(PageKey("a/2")).keys is not given.keys  # type: ignore[union-attr]


def test_replace_keeps_bytes_and_drop_frees(make: Callable[[int], Tier]) -> None:
    tier = make(2 * PAGE_BYTES)
    tier.write([(PageKey("a/0"), page(1)), (PageKey("a/1"), page(2))])
    tier.write([(PageKey("a/0"), page(3))])  # a replacement needs no extra room
    assert same(tier.read(PageKey("a/0")), page(3))
    assert tier.counters.bytes == 2 * PAGE_BYTES
    with pytest.raises(ValueError, match="capacity"):
        tier.write([(PageKey("b/0"), page(4))])
    tier.drop([PageKey("a/0"), PageKey("never")])
    assert PageKey("a/0") not in tier
    assert (tier.counters.bytes, tier.counters.pages) == (PAGE_BYTES, 1)
    tier.write([(PageKey("b/0"), page(4))])
    assert tier.free_bytes == 0


def test_records_and_page_sizes_as_durable_declares(make: Callable[[int], Tier]) -> None:
    """A durable tier keeps named records (they survive a reopen: below); one that is not
    holds none and refuses them. Either tells a stored page's size without reading it."""
    tier = make(4 * PAGE_BYTES)
    tier.write([(PageKey("a/0"), page(1, n=5))])
    assert tier.page_size_of(PageKey("a/0")) == (5, page(1, n=5).nbytes)
    if tier.durable:
        tier.put_meta("seg:a", {"pages": ["a/0"]})
        assert tier.meta == {"seg:a": {"pages": ["a/0"]}}
        tier.drop_meta("seg:a")
    else:
        with pytest.raises(TypeError, match="not durable"):
            tier.put_meta("seg:a", {})
        tier.drop_meta("seg:a")  # an absent record: ignored
    assert tier.meta == {}


def test_disk_index_survives_reopen(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    tier.write([(PageKey("a/0"), page(1)), (PageKey("a/1"), page(2))])
    tier.write([(PageKey("b/0"), page(3))])
    tier.drop([PageKey("a/1")])
    tier.put_meta("seg:a", {"pages": ["a/0"]})
    tier.close()
    again = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    assert sorted(again.page_keys()) == ["a/0", "b/0"]
    assert same(again.read(PageKey("a/0")), page(1)) and same(again.read(PageKey("b/0")), page(3))
    assert again.meta == {"seg:a": {"pages": ["a/0"]}}
    assert again.counters.bytes == 2 * PAGE_BYTES


def test_disk_deletes_an_extent_once_every_page_in_it_is_replaced(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    tier.write([(PageKey("a/0"), page(1)), (PageKey("a/1"), page(2))])
    tier.write([(PageKey("a/0"), page(3))])
    assert len(list((tmp_path / "extents").iterdir())) == 2  # a/1 still lives in the first
    tier.write([(PageKey("a/1"), page(4))])
    assert len(list((tmp_path / "extents").iterdir())) == 2  # the first is gone, at once
    assert same(tier.read(PageKey("a/0")), page(3)) and same(tier.read(PageKey("a/1")), page(4))
    tier.drop([PageKey("a/0"), PageKey("a/1")])
    assert list((tmp_path / "extents").iterdir()) == []


def test_disk_journal_is_compacted_while_running_and_replays_the_same(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False, compact_lines=16)
    journal = tmp_path / "journal.log"
    for i in range(200):  # 400 journal records over 4 live pages and one meta record
        tier.write([(PageKey(f"p/{i % 4}"), page(i))])
        tier.put_meta("seg:p", {"round": i})
        assert len(journal.read_bytes().splitlines()) <= 20  # 4 lines per live record (5)
    assert tier.compactions >= 20
    assert len(list((tmp_path / "extents").iterdir())) == 4
    tier.close()
    again = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    assert sorted(again.page_keys()) == [f"p/{i}" for i in range(4)]
    for i in range(196, 200):
        assert same(again.read(PageKey(f"p/{i % 4}")), page(i))
    assert again.meta == {"seg:p": {"round": 199}} and again.counters.bytes == 4 * PAGE_BYTES


def test_disk_rewrites_half_empty_extents_once_dead_bytes_dominate(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False, reclaim_min_bytes=0)
    tier.write([(PageKey(f"a/{i}"), page(i)) for i in range(4)])
    tier.write([(PageKey(f"b/{i}"), page(10 + i)) for i in range(4)])
    first = {f.name for f in (tmp_path / "extents").iterdir()}
    tier.drop([PageKey(f"a/{i}") for i in range(3)])  # files 8 pages, live 5: under 2x
    assert tier.reclaimed_files == 0 and tier.file_bytes > 7 * PAGE_BYTES
    calls = tier.counters.write_calls
    tier.drop([PageKey(f"b/{i}") for i in range(3)])  # live 2 in 8 pages of files: rewrite
    assert tier.reclaimed_files == 2 and tier.counters.write_calls == calls + 2
    assert tier.reclaim_bytes > 2 * PAGE_BYTES
    assert first.isdisjoint(f.name for f in (tmp_path / "extents").iterdir())
    assert tier.file_bytes < 3 * PAGE_BYTES and tier.counters.bytes == 2 * PAGE_BYTES
    assert same(tier.read(PageKey("a/3")), page(3)) and same(tier.read(PageKey("b/3")), page(13))
    tier.close()
    again = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False)
    assert sorted(again.page_keys()) == ["a/3", "b/3"]
    assert same(again.read(PageKey("b/3")), page(13))


def test_disk_counts_dead_bytes_after_reopen_and_reclaims_them_at_open(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False)  # 1 MiB floor: no reclaim yet
    tier.write([(PageKey(f"a/{i}"), page(i)) for i in range(4)])
    tier.drop([PageKey(f"a/{i}") for i in range(3)])
    size = tier.file_bytes
    assert tier.reclaimed_files == 0 and size > 3 * PAGE_BYTES
    tier.close()
    again = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False)  # the compacted journal lists
    assert again.file_bytes == size  # only a/3, but the file still holds all four pages
    again.close()
    third = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False, reclaim_min_bytes=0)
    assert third.reclaimed_files == 1 and third.file_bytes < 2 * PAGE_BYTES
    assert same(third.read(PageKey("a/3")), page(3))


def test_disk_reclaim_leaves_an_extent_with_a_bad_page_alone(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 16 * PAGE_BYTES, fsync=False, reclaim_min_bytes=0)
    tier.write([(PageKey(f"a/{i}"), page(i)) for i in range(4)])
    (extent,) = (tmp_path / "extents").iterdir()
    data = bytearray(extent.read_bytes())
    data[3 * (PAGE_BYTES + 8 * 16) + 10] ^= 0xFF  # inside page a/3
    extent.write_bytes(bytes(data))
    tier.drop([PageKey(f"a/{i}") for i in range(3)])
    assert tier.reclaimed_files == 0 and extent.exists()
    assert tier.read(PageKey("a/3")) is None and tier.counters.corrupt == 1


def test_disk_folder_gone_during_compaction_fails_writes_cleanly_then_recovers(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "disk"
    tier = DiskTier(folder, 8 * PAGE_BYTES, fsync=False, compact_lines=4)
    tier.write([(PageKey("a/0"), page(1))])
    shutil.rmtree(folder)
    with pytest.raises(TierError, match="failed"):
        tier.write([(PageKey("a/1"), page(2))])  # the extent cannot be written
    failed = tier.counters.failed_writes
    for i in range(10):  # the compaction at 8 lines fails (rewrite, reopen), then every
        tier.put_meta("m", i)  # journal-only change fails too: counted, never raised
    assert tier.counters.failed_writes >= failed + 4 and tier.compactions == 0
    (folder / "extents").mkdir(parents=True)
    tier.write([(PageKey("a/2"), page(3))])  # the folder is back: the journal reopens
    assert same(tier.read(PageKey("a/2")), page(3))
    tier.close()
    assert "a/2" in DiskTier(folder, 8 * PAGE_BYTES, fsync=False).page_keys()


def test_disk_corrupt_truncated_or_missing_page_reads_none(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    tier.write([(PageKey("a/0"), page(1))])
    tier.write([(PageKey("b/0"), page(2))])
    tier.write([(PageKey("c/0"), page(3))])
    files = sorted((tmp_path / "extents").iterdir())
    data = bytearray(files[0].read_bytes())
    data[100] ^= 0xFF
    files[0].write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[:50])
    files[2].unlink()
    assert tier.read(PageKey("a/0")) is None
    assert tier.read(PageKey("b/0")) is None
    assert tier.read(PageKey("c/0")) is None
    assert tier.counters.corrupt == 3 and tier.counters.loads == 0


def test_disk_torn_journal_tail_is_ignored(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    tier.write([(PageKey("a/0"), page(1))])
    tier.write([(PageKey("b/0"), page(2))])
    tier.close()
    journal = tmp_path / "journal.log"
    journal.write_bytes(journal.read_bytes()[:-20])  # the last record, torn
    again = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)
    assert again.page_keys() == ["a/0"] and again.journal_bad_lines == 1
    assert len(list((tmp_path / "extents").iterdir())) == 1  # the orphan extent is deleted


def test_disk_write_failure_raises_tier_error_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=False)

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tier, "_write_file", full)
    with pytest.raises(TierError, match="No space left"):
        tier.write([(PageKey("a/0"), page(1))])
    assert PageKey("a/0") not in tier
    assert tier.counters.failed_writes == 1 and tier.counters.bytes == 0


def test_disk_folder_not_writable_is_a_clear_error(tmp_path: Path) -> None:
    from agentcache.errors import CacheDirError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheDirError, match="not writable"):
        DiskTier(blocker / "sub", PAGE_BYTES)


# ---- deltas: a page stored as the changed slots on top of the copy the tier holds ----


def patched(base: PageData, new: PageData, slots: list[int]) -> PageData:
    keys, values, positions = base.keys.clone(), base.values.clone(), base.positions.clone()
    idx = torch.tensor(slots)
    keys[:, idx], values[:, idx] = new.keys[:, idx], new.values[:, idx]
    positions[idx] = new.positions[idx]
    return PageData(keys, values, positions)


def test_write_with_deltas_reads_back_the_whole_new_page(make: Callable[[int], Tier]) -> None:
    tier = make(4 * PAGE_BYTES)
    key = PageKey("s/0")
    tier.write([(key, page(0))])
    v2 = patched(page(0), page(50), [1, 7])
    tier.write([(key, v2), (PageKey("s/1"), page(1))], {key: [1, 7]})
    assert same(tier.read(key), v2) and same(tier.read(PageKey("s/1")), page(1))
    assert tier.counters.bytes == 2 * PAGE_BYTES  # a page counts once, however stored


def test_disk_delta_writes_only_the_changed_slots(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "disk", 4 * PAGE_BYTES, fsync=False)
    key = PageKey("s/0")
    tier.write([(key, page(0))])
    before = tier.counters.bytes_written
    v2 = patched(page(0), page(50), [3, 4])
    tier.write([(key, v2)], {key: [3, 4]})
    written = tier.counters.bytes_written - before
    slot_bytes = PAGE_BYTES // 16 + 8  # K/V of one token in every layer, and its position
    assert 2 * slot_bytes < written < 2 * slot_bytes + 400  # the delta and its journal line
    assert tier.counters.delta_writes == 1 and tier.counters.writes == 2
    assert same(tier.read(key), v2)


def test_disk_delta_chain_survives_reopen_and_compaction(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    tier = DiskTier(folder, 4 * PAGE_BYTES, fsync=False)
    key = PageKey("s/0")
    tier.write([(key, page(0))])
    want = page(0)
    for r, slots in enumerate(([0], [5, 6], [15])):
        want = patched(want, page(100 + r), slots)
        tier.write([(key, want), (PageKey(f"x/{r}"), page(r))], {key: slots})
        tier.drop([PageKey(f"x/{r}")])
    assert tier.counters.delta_writes == 3 and same(tier.read(key), want)
    tier.close()
    for _ in range(2):  # replays the journal as written, then as compacted at the first open
        again = DiskTier(folder, 4 * PAGE_BYTES, fsync=False)
        assert same(again.read(key), want) and again.counters.bytes == PAGE_BYTES
        again.close()
    assert len(list((folder / "extents").iterdir())) == 4  # base and three deltas
    assert len((folder / "journal.log").read_bytes().splitlines()) == 4  # one put per file


def test_disk_writes_whole_when_a_delta_cannot_apply(tmp_path: Path) -> None:
    """No copy to build on, slots out of range or all of them, or a chain already at its
    limit (MAX_DELTAS, or twice a page's bytes): the page is written whole, replacing the
    chain, and the files of the old chain go."""
    from agentcache.tiers.disk import MAX_DELTAS

    folder = tmp_path / "disk"
    tier = DiskTier(folder, 4 * PAGE_BYTES, fsync=False)
    key = PageKey("s/0")
    tier.write([(key, page(0))], {key: [1]})  # nothing on disk yet
    tier.write([(key, page(1))], {key: [16]})
    tier.write([(key, page(2))], {key: list(range(16))})
    assert tier.counters.delta_writes == 0 and same(tier.read(key), page(2))
    want = page(2)
    for r in range(MAX_DELTAS + 1):
        want = patched(want, page(10 + r), [r])
        tier.write([(key, want)], {key: [r]})
    assert tier.counters.delta_writes == MAX_DELTAS and same(tier.read(key), want)
    assert len(list((folder / "extents").iterdir())) == 1  # the last write was whole
    big = patched(want, page(40), list(range(12)))
    tier.write([(key, big)], {key: list(range(12))})
    tier.write([(key, patched(big, page(41), list(range(5))))], {key: list(range(5))})
    assert tier.counters.delta_writes == MAX_DELTAS + 1  # 12 + 5 slots > one page: whole
    assert same(tier.read(key), patched(big, page(41), list(range(5))))


def test_disk_corrupt_delta_or_base_makes_the_page_a_miss(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    tier = DiskTier(folder, 4 * PAGE_BYTES, fsync=False)
    a, b = PageKey("s/0"), PageKey("s/1")
    tier.write([(a, page(0)), (b, page(1))])
    tier.write([(a, patched(page(0), page(9), [2]))], {a: [2]})
    delta = sorted((folder / "extents").iterdir())[-1]
    data = bytearray(delta.read_bytes())
    data[5] ^= 0xFF
    delta.write_bytes(bytes(data))
    assert tier.read(a) is None and tier.counters.corrupt == 1
    assert same(tier.read(b), page(1))  # the base's other page is fine
    tier.write([(b, patched(page(1), page(8), [0]))], {b: [0]})
    sorted((folder / "extents").iterdir())[0].unlink()  # the base file of both
    assert tier.read(b) is None and tier.counters.corrupt == 2


def test_disk_reclaim_rewrites_chains_whole(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    tier = DiskTier(folder, 64 * PAGE_BYTES, fsync=False, reclaim_min_bytes=0)
    keys = [PageKey(f"s/{i}") for i in range(4)]
    tier.write([(k, page(i)) for i, k in enumerate(keys)])
    want = patched(page(0), page(20), [4])
    tier.write([(keys[0], want)], {keys[0]: [4]})
    tier.drop(keys[1:])  # the base file is now mostly dead: reclaimed
    assert tier.reclaimed_files >= 1 and same(tier.read(keys[0]), want)
    assert len(list((folder / "extents").iterdir())) == 1
    assert tier.file_bytes <= 2 * (PAGE_BYTES + 8 * 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_pages_of_any_dtype_and_odd_sizes_read_back_exactly(
    make: Callable[[int], Tier], dtype: torch.dtype
) -> None:
    # 3 tokens of 1 value: the positions start at byte 6 or 12 (not a multiple of 8)
    g = torch.Generator().manual_seed(5)
    keys, values = (torch.randn((1, 3, 1, 1), generator=g).to(dtype) for _ in range(2))
    odd = PageData(keys, values, torch.tensor([7, 8, 9]))
    tier = make(4 * PAGE_BYTES)
    tier.write([(PageKey("o/0"), odd), (PageKey("o/1"), page(2))])
    got = tier.read(PageKey("o/0"))
    assert got is not None and got.keys.dtype == dtype and same(got, odd)
    assert same(tier.read(PageKey("o/1")), page(2))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name an fd")
def test_disk_write_makes_extent_name_durable_before_journal_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power-loss order: the extent's data, then its directory entry, then the journal line
    naming it. A line whose file a crash forgot would lose a committed segment."""
    tier = DiskTier(tmp_path, 8 * PAGE_BYTES, fsync=True)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        synced.append(f"{kind}:{Path(path).name}")
        real_fsync(fd)

    monkeypatch.setattr(disk_mod.os, "fsync", recording_fsync)
    tier.write([(PageKey("a/0"), page(1))])
    assert synced == ["file:0000000001.tmp", "dir:extents", "file:journal.log"]
    synced.clear()  # a new folder's entry is made durable in its parent at open
    DiskTier(tmp_path / "new", 8 * PAGE_BYTES, fsync=True)
    assert synced[0] == f"dir:{tmp_path.name}" and "dir:new" in synced
    synced.clear()  # an existing one is not synced again
    DiskTier(tmp_path / "new", 8 * PAGE_BYTES, fsync=True)
    assert f"dir:{tmp_path.name}" not in synced
