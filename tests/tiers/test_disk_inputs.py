"""What a disk tier folder may hold that the tier did not write: crafted or bit-flipped
journal records, damaged extents, a second writer. Each is refused by name, counted, and
costs only what it names; nothing outside the folder is ever touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.errors import CacheDirError
from agentcache.tiers import DiskTier, PageData, PageKey
from agentcache.tiers.journal import line

CAP = 1 << 20


def page(seed: int, n: int = 16) -> PageData:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn((2, n, 2, 4), generator=g)
    return PageData(keys, torch.randn((2, n, 2, 4), generator=g), torch.arange(seed, seed + n))


def same(a: PageData | None, b: PageData) -> bool:
    return a is not None and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def three_extents(folder: Path) -> None:
    tier = DiskTier(folder, CAP, fsync=False)
    for i in range(3):
        tier.write([(PageKey(f"s{i}/0"), page(i))])
    tier.close()


def good_entry() -> dict[str, Any]:
    return {"key": "x/0", "off": 0, "shape": [2, 16, 2, 4], "dtype": "float32", "crc": 1}


def put(**changes: Any) -> dict[str, Any]:
    return {"op": "put", "file": "0000000009.ext", "pages": [good_entry() | changes]}


CRAFTED: list[tuple[str, Any, str]] = [
    ("file-parent", {"op": "put", "file": "../outside.ext", "pages": []}, "extent names"),
    ("file-absolute", {"op": "put", "file": "/etc/passwd", "pages": []}, "extent names"),
    ("file-nested", {"op": "put", "file": "0000000001.ext/../../x", "pages": []}, "extent names"),
    ("file-int", {"op": "put", "file": 5, "pages": []}, "extent names"),
    ("file-short", {"op": "put", "file": "1.ext", "pages": []}, "extent names"),
    ("file-tmp", {"op": "put", "file": "0000000001.tmp", "pages": []}, "extent names"),
    ("file-dotdot", {"op": "put", "file": "..", "pages": []}, "extent names"),
    ("pages-dict", {"op": "put", "file": "0000000009.ext", "pages": {}}, "no page list"),
    ("page-str", {"op": "put", "file": "0000000009.ext", "pages": ["x"]}, "without a page key"),
    ("page-no-key", put(key=None), "without a page key"),
    ("page-key-int", put(key=3), "without a page key"),
    ("page-key-long", put(key="k" * 600), "without a page key"),
    ("shape-3", put(shape=[2, 16, 2]), "is not 4 sizes"),
    ("shape-negative", put(shape=[2, -16, 2, 4]), "is not 4 sizes"),
    ("shape-str", put(shape="2,16,2,4"), "is not 4 sizes"),
    ("shape-huge", put(shape=[2, 16, 2, 1 << 40]), "is not 4 sizes"),
    ("off-negative", put(off=-8), "offset or crc"),
    ("off-float", put(off=1.5), "offset or crc"),
    ("crc-str", put(crc="ff"), "offset or crc"),
    ("crc-huge", put(crc=1 << 40), "offset or crc"),
    ("dtype-module", put(dtype="os"), "is not a torch dtype"),
    ("dtype-unknown", put(dtype="float99"), "is not a torch dtype"),
    ("dtype-function", put(dtype="zeros"), "is not a torch dtype"),
    ("dtype-int", put(dtype=4), "is not a torch dtype"),
    ("slots-length", put(slots=[0, 1]), "delta slots do not match"),
    ("slots-negative", put(shape=[2, 1, 2, 4], slots=[-1]), "delta slots do not match"),
    ("slots-str", put(slots="0-15"), "delta slots do not match"),
    ("drop-str", {"op": "drop", "keys": "s0/0"}, "drop without a list"),
    ("drop-ints", {"op": "drop", "keys": [1, 2]}, "drop without a list"),
    ("meta-no-name", {"op": "meta", "value": 1}, "meta without a name"),
    ("unmeta-int", {"op": "unmeta", "name": 7}, "unmeta without a name"),
    ("op-unknown", {"op": "exec", "cmd": "rm -rf /"}, "unknown journal operation 'exec'"),
    ("op-missing", {"file": "0000000001.ext"}, "unknown journal operation"),
]


@pytest.mark.parametrize(
    ("record", "problem"), [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED]
)
def test_a_crafted_record_is_skipped_named_and_costs_nothing_else(
    tmp_path: Path, record: dict[str, Any], problem: str
) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + line(record) + b"".join(lines[1:]))
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.journal_corrupt_lines == 1 and tier.journal_bad_lines == 0
    assert len(tier.journal_problems) == 1 and str(journal) in tier.journal_problems[0]
    assert "line 2" in tier.journal_problems[0] and problem in tier.journal_problems[0]
    assert all(same(tier.read(PageKey(f"s{i}/0")), page(i)) for i in range(3))


def deep_json_line() -> bytes:
    """A line whose crc matches but whose JSON nests past the parser's recursion limit."""
    body = b"[" * 100000 + b"]" * 100000
    return b"%08x " % zlib.crc32(body) + body + b"\n"


RAW: list[tuple[str, bytes]] = [
    ("crc-flipped", b"00000000 " + line({"op": "drop", "keys": ["s0/0"]}).split(b" ", 1)[1]),
    ("not-hex", b"zzzzzzzz {}\n"),
    ("no-space", b"0000000000000000\n"),
    ("not-utf8", b"\xff\xfe\xfd garbage\n"),
    ("json-list", line({"op": "x"}).replace(b'{"op":"x"}', b"[1,2]")),
    ("deep-json", deep_json_line()),
]


@pytest.mark.parametrize("raw", [c[1] for c in RAW], ids=[c[0] for c in RAW])
def test_a_line_failing_its_crc_before_the_last_is_skipped(tmp_path: Path, raw: bytes) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + raw + b"".join(lines[1:]))
    tier = DiskTier(folder, CAP, fsync=False)
    assert (
        tier.journal_corrupt_lines == 1
        and "line 2: fails its crc or does not parse" in tier.journal_problems[0]
    )
    assert all(same(tier.read(PageKey(f"s{i}/0")), page(i)) for i in range(3))


def test_one_flipped_bit_in_the_first_line_loses_only_that_extent(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    journal = folder / "journal.log"
    data = bytearray(journal.read_bytes())
    data[40] ^= 0x01  # inside the first record's JSON
    journal.write_bytes(bytes(data))
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.journal_corrupt_lines == 1
    assert tier.read(PageKey("s0/0")) is None
    assert same(tier.read(PageKey("s1/0")), page(1)) and same(tier.read(PageKey("s2/0")), page(2))
    assert tier.quarantined_files == ["0000000001.ext"]  # kept aside, not deleted
    assert (folder / "quarantine" / "0000000001.ext").is_file()
    tier.write([(PageKey("s3/0"), page(3))])  # numbering goes on past the quarantined file
    assert sorted(f.name for f in (folder / "extents").iterdir())[-1] == "0000000004.ext"


def test_a_crafted_put_cannot_make_drop_unlink_a_file_outside_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    victim = tmp_path / "victim.ext"
    victim.write_bytes(b"precious")
    three_extents(folder)
    entry = good_entry() | {"key": "evil/0"}
    with open(folder / "journal.log", "ab") as f:
        f.write(line({"op": "put", "file": "../../victim.ext", "pages": [entry]}))
        f.write(line({"op": "drop", "keys": ["s0/0"]}))  # a good line after it
    tier = DiskTier(folder, CAP, fsync=False)
    assert PageKey("evil/0") not in tier
    tier.drop([PageKey("evil/0"), PageKey("s1/0")])
    assert victim.read_bytes() == b"precious"
    assert tier.page_keys() == [PageKey("s2/0")]


def test_a_second_writer_in_this_process_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    tier = DiskTier(tmp_path, CAP, fsync=False)
    tier.write([(PageKey("a/0"), page(1))])
    with pytest.raises(CacheDirError, match=rf"{tmp_path} is in use by process \d+"):
        DiskTier(tmp_path, CAP, fsync=False)
    tier.close()
    again = DiskTier(tmp_path, CAP, fsync=False)
    assert same(again.read(PageKey("a/0")), page(1))
    again.close()


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from agentcache.tiers import DiskTier
    tier = DiskTier(Path(sys.argv[1]), 1 << 20, fsync=False)
    print("ready", flush=True)
    time.sleep(60)
""")


def test_a_second_process_is_told_which_process_holds_the_folder(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=root
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(CacheDirError, match=f"in use by process {holder.pid}"):
            DiskTier(tmp_path, CAP, fsync=False)
    finally:
        holder.kill()
        holder.wait()
    DiskTier(tmp_path, CAP, fsync=False).close()  # a killed holder's lock goes with it


DAMAGE = ["flip", "truncate", "delete", "folder", "empty"]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_extent_is_a_counted_miss_for_its_pages_only(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "disk"
    three_extents(folder)
    target = folder / "extents" / "0000000002.ext"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[10] ^= 0x80
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    elif damage == "folder":
        target.unlink()
        target.mkdir()
    else:
        target.write_bytes(b"")
    tier = DiskTier(folder, CAP, fsync=False)
    assert tier.read(PageKey("s1/0")) is None and tier.counters.corrupt == 1
    assert same(tier.read(PageKey("s0/0")), page(0)) and same(tier.read(PageKey("s2/0")), page(2))
