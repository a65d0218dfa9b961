"""Attacks on a disk tier folder through what its entries are rather than what they hold:
symbolic links planted at the names the tier writes, and a journal emptied or cut short.
A link is refused by name before anything is written; a journal that lost lines costs the
pages it no longer names, which are set aside (quarantined), never deleted."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agentcache.errors import CacheDirError
from agentcache.fsutil import open_nofollow, write_atomic
from agentcache.tiers import DiskTier, PageKey
from tests.tiers.test_disk_inputs import CAP, page, same, three_extents

EXTENTS = ["0000000001.ext", "0000000002.ext", "0000000003.ext"]


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(b"precious")
    return path


@pytest.mark.parametrize("name", ["lock", "journal.tmp", ".write-probe", "journal.log"])
def test_a_link_at_a_name_the_tier_writes_is_refused_and_its_target_untouched(
    tmp_path: Path, name: str
) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    target = victim(tmp_path)
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(target)
    with pytest.raises(CacheDirError) as e:
        DiskTier(folder, CAP, fsync=False)
    assert f"{folder / name} -> {target}" in str(e.value)
    assert "symbolic link" in str(e.value)
    assert target.read_bytes() == b"precious"


def test_an_extents_link_to_a_folder_is_refused_and_the_folder_keeps_its_files(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "photos"
    elsewhere.mkdir()
    for name in ("a.jpg", "0000000001.ext"):
        (elsewhere / name).write_bytes(b"mine")
    folder = tmp_path / "disk"
    folder.mkdir()
    (folder / "extents").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CacheDirError) as e:
        DiskTier(folder, CAP, fsync=False)
    assert str(folder / "extents") in str(e.value)
    assert sorted(f.name for f in elsewhere.iterdir()) == ["0000000001.ext", "a.jpg"]
    assert not (tmp_path / "quarantine").exists()


def test_a_link_inside_extents_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    target = victim(tmp_path)
    (folder / "extents" / "0000000009.ext").symlink_to(target)
    with pytest.raises(CacheDirError, match=r"0000000009\.ext"):
        DiskTier(folder, CAP, fsync=False)
    assert target.read_bytes() == b"precious"


def test_the_folder_itself_may_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    three_extents(real)
    (tmp_path / "disk").symlink_to(real, target_is_directory=True)
    tier = DiskTier(tmp_path / "disk", CAP, fsync=False)
    assert same(tier.read(PageKey("s2/0")), page(2))
    tier.close()


def test_a_link_planted_while_the_tier_runs_is_not_written_through(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    tier = DiskTier(folder, CAP, fsync=False, compact_lines=4)
    target = victim(tmp_path)
    (folder / "journal.tmp").symlink_to(target)
    for i in range(8):  # one live extent, eight lines: a compaction, which writes journal.tmp
        tier.write([(PageKey("s/0"), page(i))])
    assert tier.compactions == 0
    assert tier.counters.failed_writes >= 1  # the compaction failed (ELOOP) and was counted
    assert target.read_bytes() == b"precious"
    assert same(tier.read(PageKey("s/0")), page(7))
    tier.close()
    (folder / "journal.tmp").unlink()
    assert same(DiskTier(folder, CAP, fsync=False).read(PageKey("s/0")), page(7))


@pytest.mark.parametrize("mode", ["rb", "wb", "ab", "a+b"])
def test_open_nofollow_refuses_a_link_in_every_mode(tmp_path: Path, mode: str) -> None:
    target = victim(tmp_path)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError) as e:
        open_nofollow(tmp_path / "link", mode)
    assert e.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        write_atomic(tmp_path / "out", b"x", fsync=False, tmp=tmp_path / "link")
    assert target.read_bytes() == b"precious"
    assert (tmp_path / "link").is_symlink()  # the planted link is left for the user to see


def quarantined(folder: Path) -> list[str]:
    return sorted(f.name for f in (folder / "quarantine").iterdir())


def test_an_emptied_journal_quarantines_every_extent(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    (folder / "journal.log").write_bytes(b"")
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.page_keys() == []
    assert tier.quarantined_files == EXTENTS
    assert quarantined(folder) == EXTENTS
    tier.write([(PageKey("s9/0"), page(9))])  # numbering goes on past the quarantined files
    assert [f.name for f in (folder / "extents").iterdir()] == ["0000000004.ext"]
    tier.close()


def test_a_missing_journal_quarantines_every_extent(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    (folder / "journal.log").unlink()
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.quarantined_files == EXTENTS
    tier.close()


def test_a_journal_cut_mid_line_quarantines_the_extents_it_lost(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + lines[1][:30])  # line 2 torn, line 3 gone
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.journal_bad_lines == 1
    assert same(tier.read(PageKey("s0/0")), page(0))
    assert tier.quarantined_files == EXTENTS[1:]
    assert tier.orphan_files == 0
    tier.close()


def test_the_extent_of_a_write_killed_before_its_line_is_deleted_as_an_orphan(
    tmp_path: Path,
) -> None:
    """A kill between the extent's rename and its journal line leaves one extent, numbered
    after every extent the journal names: never committed (the write had not returned).
    (Cutting the journal's last whole line looks the same, and is treated the same.)"""
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:2]))
    (folder / "extents" / "0000000004.tmp").write_bytes(b"half a write")  # killed earlier
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.orphan_files == 1 and tier.quarantined_files == []
    assert sorted(f.name for f in (folder / "extents").iterdir()) == EXTENTS[:2]
    assert same(tier.read(PageKey("s1/0")), page(1))
    tier.close()


def test_an_unnamed_extent_below_the_journals_last_is_quarantined(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + lines[2])  # the middle line lost: not a killed write
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.quarantined_files == ["0000000002.ext"] and tier.orphan_files == 0
    tier.close()


def test_files_the_tier_did_not_name_are_left_in_place(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    (folder / "extents" / "notes.txt").write_bytes(b"mine")
    tier = DiskTier(folder, CAP, fsync=False)
    assert (folder / "extents" / "notes.txt").read_bytes() == b"mine"
    assert same(tier.read(PageKey("s0/0")), page(0))
    tier.close()


def test_a_quarantined_file_is_never_overwritten_by_a_later_one(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    (folder / "journal.log").write_bytes(b"")
    DiskTier(folder, CAP, fsync=False).close()
    # a second set of the same names (e.g. copied back by hand), journal emptied again
    for name in EXTENTS:
        os.link(folder / "quarantine" / name, folder / "extents" / name)
    (folder / "journal.log").write_bytes(b"")
    DiskTier(folder, CAP, fsync=False).close()
    assert quarantined(folder) == sorted([*EXTENTS, *(n + "~" for n in EXTENTS)])
