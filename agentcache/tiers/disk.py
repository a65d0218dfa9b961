"""Disk tier: checksummed pages in extent files, indexed by an append-only journal.

(One module of ~550 lines, one class: writing extents, replaying and compacting the journal,
reclaiming half-empty extents and reading page chains all change the same index under one
invariant, that a page exists exactly when a durable journal line names its whole chain; the
journal's line format and checks are apart, in agentcache/tiers/journal.py.)

    folder/extents/0000000007.ext   one file per write call: pages back to back
                                    [keys bytes | values bytes | positions bytes] per page
    folder/journal.log              one line per change: "<crc32 of json> <json>\\n"
                                    put  {file, pages: [{key, off, shape, dtype, crc[, slots]}]}
                                    drop {keys}   meta {name, value}   unmeta {name}
    folder/lock                     flock'd by the one tier that writes the folder (its pid)
    folder/quarantine/              extents set aside because a corrupt line may name them

A page is a chain: a whole copy (base) and up to `MAX_DELTAS` deltas after it. A delta holds
only the token slots a newer version changed (the entry's `slots`; its shape counts just
those tokens), in the same [keys | values | positions] layout; a read applies the deltas to
the base in journal order. Each piece has its own crc: any piece missing, short or failing
it makes the whole page a miss. A delta is written only when the chain stays within twice a
page's bytes; otherwise the page is written whole, which replaces its chain.

A write call writes its extent to a temporary file, fsyncs it, renames it into place and
fsyncs the folder (so the name survives a power loss), then appends and fsyncs its journal
line: the pages exist once their line is in the journal. A kill at any moment leaves either
no line (the extent is an orphan, deleted at the next open) or a whole line; a torn last
line fails its crc and replay stops there; an earlier line that fails its crc or its checks
(`journal.check`: a crafted file name never reaches the index) is skipped and counted. At
open the journal is replayed and rewritten compacted (write-then-rename), and again
whenever it has grown to more than `COMPACT_FACTOR` lines per live record (and at least
`compact_lines`), so a long-running process's journal stays proportional to what the tier
holds. An extent file whose every page was replaced or
dropped is deleted once the journal no longer needs it, and once the extent files hold more
than `SPACE_FACTOR` times the live pages' bytes, the live pages of the emptiest files are
written again into a new extent (an ordinary write call, counted like any other) so those
files can go: the folder stays within a bounded multiple of the tier's capacity. A page
whose file is missing, short, or fails its crc reads as None and is counted corrupt: never
served.
"""

from __future__ import annotations

import functools
import io
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import CacheDirError
from agentcache.fsutil import NOFOLLOW, links_among, open_nofollow, sync_dir, write_atomic
from agentcache.tiers import journal
from agentcache.tiers.base import PageData, PageKey, Tier, TierError

JOURNAL = "journal.log"
MAX_DELTAS = 4  # deltas on top of a page's base before it is written whole again
COMPACT_FACTOR = 4  # journal lines per live record (extent or meta) before a compaction
SPACE_FACTOR = 2.0  # extent-file bytes per live page byte before half-empty extents are rewritten
RECLAIM_MIN_BYTES = 1 << 20  # ... and only once this much is dead


@dataclass(frozen=True)
class _Loc:
    """One piece of a page in an extent file: the whole page, or a delta of `slots`."""

    file: str
    off: int
    shape: tuple[int, int, int, int]  # (L, n, Hkv, Dh); n = len(slots) for a delta
    dtype: str
    crc: int
    slots: tuple[int, ...] | None = None  # None: a whole page (the base of its chain)

    @property
    def kv_bytes(self) -> int:
        layers, n, heads, dim = self.shape
        return 2 * layers * n * heads * dim * _itemsize(self.dtype)

    @property
    def length(self) -> int:
        return self.kv_bytes + 8 * self.shape[1]


def _number(extent: str) -> int:
    return int(extent.split(".")[0])


@functools.cache
def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _page_parts(page: PageData, slots: Sequence[int] | None = None) -> list[memoryview]:
    """The page's [keys | values | positions] bytes, as views of its tensors (no copy when
    they are contiguous on the CPU); any dtype, bfloat16 too."""
    if slots is not None:
        page = page.take(slots)
    parts = (page.keys, page.values, page.positions.to(torch.int64))
    return [t.detach().cpu().contiguous().view(torch.uint8).numpy().data for t in parts]


def _entry(key: PageKey, loc: _Loc) -> dict[str, Any]:
    entry = {"key": key, "off": loc.off, "shape": list(loc.shape), "dtype": loc.dtype,
             "crc": loc.crc}  # fmt: skip
    if loc.slots is not None:
        entry["slots"] = list(loc.slots)
    return entry


def _chain_ok(chain: list[_Loc], page: PageData, slots: Sequence[int]) -> bool:
    """Whether `slots` of `page` may go on top of `chain` as a delta."""
    base = chain[0]
    n = base.shape[1]
    return (
        0 < len(slots) < n
        and len(chain) <= MAX_DELTAS
        and list(page.keys.shape) == list(base.shape)
        and str(page.keys.dtype).removeprefix("torch.") == base.dtype
        and all(0 <= s < n for s in slots)
        and sum(loc.shape[1] for loc in chain[1:]) + len(slots) <= n
    )


class DiskTier(Tier):
    name = "disk"
    durable = True

    def __init__(
        self,
        folder: Path,
        capacity_bytes: int,
        fsync: bool = True,
        compact_lines: int = 4096,
        reclaim_min_bytes: int = RECLAIM_MIN_BYTES,
    ) -> None:
        super().__init__(capacity_bytes)
        self.folder = Path(folder)
        self.fsync = fsync
        self.compact_lines = compact_lines  # no compaction below this many journal lines
        self.compactions = 0  # journal rewrites after the one at open
        self._lines = 0  # lines in the journal file now
        self.reclaim_min_bytes = reclaim_min_bytes  # dead bytes below this are left alone
        self.reclaimed_files = 0  # extent files emptied by rewriting their live pages
        self.reclaim_bytes = 0  # bytes those rewrites wrote (also in counters.bytes_written)
        self._reclaiming = False
        self._locs: dict[PageKey, list[_Loc]] = {}  # page -> [base, delta, ...]
        self._file_live: dict[str, int] = {}  # extent file -> bytes of its live pages (> 0)
        self._file_size: dict[str, int] = {}  # extent file -> its length in bytes
        self._live_bytes = 0  # sums of the two, kept as they change
        self.file_bytes = 0  # bytes of the extent files the index still needs
        self._meta: dict[str, Any] = {}  # opaque records the store persists (segment index)
        self.journal_bad_lines = 0  # a torn last line (a kill while appending)
        self.journal_corrupt_lines = 0  # lines before the last failing their crc or checks
        self.journal_problems: list[str] = []  # what the first of them were (at most 16)
        self.quarantined_files: list[str] = []  # extents moved aside: no line may name them
        self.orphan_files = 0  # extents of a write killed before its journal line, deleted
        self._named: set[str] = set()  # extents a good journal line named, at open
        self._journal: io.BufferedIOBase | None = None
        self._lock: journal.FolderLock | None = None
        self._open()

    # ---- start-up: check the folder, replay and compact the journal, delete orphans ----

    def _open(self) -> None:
        extents = self.folder / "extents"
        self._refuse_links()
        try:
            fresh = not extents.is_dir()
            extents.mkdir(parents=True, exist_ok=True)
            if fresh:  # the folder's own entry, so a power loss cannot drop the whole tier
                self._sync_dir(self.folder.parent)
            probe = self.folder / ".write-probe"
            with open_nofollow(probe, "wb") as f:
                f.write(b"ok")
            probe.unlink()
        except OSError as e:
            raise CacheDirError(
                f"disk tier folder {self.folder} is not writable ({e.strerror or e}); "
                "choose another folder (disk_dir) or run without a disk tier"
            ) from e
        try:
            self._lock = journal.FolderLock(self.folder)
            self._replay()
            self._rewrite_journal()
            self._sweep(extents)
            self._open_journal()
        except OSError as e:  # e.g. a journal that is a folder, or another user's file
            self.close()
            raise CacheDirError(
                f"disk tier folder {self.folder} cannot be opened: {e.filename or self.folder} "
                f"({e.strerror or e}); fix or remove it, or choose another folder (disk_dir)"
            ) from e
        quarantined = (self.folder / "quarantine").glob("*.ext")
        names = [*self._file_live, *self._named, *(f.name for f in quarantined)]
        self._next = 1 + max(map(_number, names), default=0)
        self._named.clear()
        self._maybe_reclaim()  # what a process killed before its reclaim left

    def _refuse_links(self) -> None:
        """A symbolic link among the folder's entries (or in extents/, quarantine/) is refused:
        the tier writes, renames and deletes there, and through a link it would do so to a
        file or folder elsewhere. (Every open also uses O_NOFOLLOW, for links planted later.)
        The folder itself may be a link: that is where the user put it."""
        try:
            inside = [self.folder / name for name in ("extents", "quarantine")]
            paths = [p for p in self.folder.iterdir()] if self.folder.is_dir() else []
            for sub in inside:
                if sub.is_dir() and not sub.is_symlink():
                    paths += sub.iterdir()
        except OSError as e:
            raise CacheDirError(
                f"disk tier folder {self.folder} cannot be listed: {e.filename or self.folder} "
                f"({e.strerror or e}); fix it, or choose another folder (disk_dir)"
            ) from e
        links = links_among(paths)
        if links:
            named = ", ".join(f"{p} -> {os.readlink(p)}" for p in links[:4])
            raise CacheDirError(
                f"disk tier folder {self.folder} holds {len(links)} symbolic link(s): {named}; "
                "the tier never follows links in its folder (it would write or delete through "
                "them): remove them, or choose another folder (disk_dir)"
            )

    def _replay(self) -> None:
        """Apply the journal's records in order. A last line failing its crc is a torn tail
        (a kill while appending: nothing after it was committed); an earlier line failing
        its crc or its checks is corrupt: skipped and counted, the records after it still
        apply, and the extents no record names are quarantined (see `_sweep`)."""
        path = self.folder / JOURNAL
        if not path.exists():
            return
        with open_nofollow(path) as f:
            lines = f.read().splitlines(keepends=True)
        for i, raw in enumerate(lines):
            record = journal.parse(raw) if raw.endswith(b"\n") else None
            problem = "fails its crc or does not parse" if record is None else journal.check(record)
            if problem is None:
                assert record is not None
                self._apply(record)
                if record["op"] == "put":
                    self._named.add(record["file"])
            elif i == len(lines) - 1:
                self.journal_bad_lines += 1
            else:
                self.journal_corrupt_lines += 1
                if len(self.journal_problems) < 16:
                    self.journal_problems.append(f"{path} line {i + 1}: {problem}")

    def _sweep(self, extents: Path) -> None:
        """Size the extents the index needs; delete those it provably does not; move the
        rest to `quarantine/` (never deleted by the tier: listed in `quarantined_files`).

        Provably garbage: an extent a good journal line named whose pages were all replaced
        or dropped since (a kill before its unlink), a temporary `<extent>.tmp` (a kill
        before its rename: never committed), and the orphan of the one write call a kill
        can leave without its journal line: the single unnamed extent, numbered above every
        extent the journal names, in a journal that names at least one and has no corrupt
        line. Any other unnamed extent means the journal lost lines (emptied, truncated,
        corrupt): its pages may be committed, so it is set aside, not deleted. Files the
        tier does not name its own are left where they are."""
        unnamed = []
        for f in sorted(extents.iterdir()):
            if f.name in self._file_live:  # the journal knows where live pages end
                size = f.lstat().st_size
                self.file_bytes += max(0, size - self._file_size[f.name])
                self._file_size[f.name] = max(size, self._file_size[f.name])
            elif f.name in self._named:
                f.unlink(missing_ok=True)
            elif journal.EXTENT_NAME.fullmatch(f.name):
                unnamed.append(f)
            elif f.suffix == ".tmp" and journal.EXTENT_NAME.fullmatch(f.stem + ".ext"):
                f.unlink(missing_ok=True)
        last_named = max((_number(n) for n in self._named), default=0)
        if (
            len(unnamed) == 1
            and last_named > 0
            and not self.journal_corrupt_lines
            and _number(unnamed[0].name) > last_named
        ):
            unnamed.pop().unlink(missing_ok=True)
            self.orphan_files += 1
        for f in unnamed:
            aside = self.folder / "quarantine"
            aside.mkdir(exist_ok=True)
            target = aside / f.name
            while target.exists():  # set aside by an earlier open: keep both
                target = target.with_name(target.name + "~")
            os.replace(f, target)
            self.quarantined_files.append(f.name)

    def _apply(self, r: dict[str, Any]) -> list[str]:
        """Apply one journal record to the index; returns the extent files it left empty."""
        op = r.get("op")
        emptied = []
        if op == "put":
            for p in r["pages"]:
                key = PageKey(p["key"])
                slots = p.get("slots")
                loc = _Loc(r["file"], p["off"], tuple(p["shape"]), p["dtype"], p["crc"],
                           None if slots is None else tuple(slots))  # fmt: skip
                if slots is not None:  # a delta: on top of the page's chain
                    chain = self._locs.get(key)
                    if chain is None:  # its base is gone: the delta is garbage
                        continue
                    chain.append(loc)
                else:
                    emptied += self._forget(key)
                    self._locs[key] = [loc]
                    self.counters.bytes += loc.kv_bytes
                self._file_live[loc.file] = self._file_live.get(loc.file, 0) + loc.length
                self._live_bytes += loc.length
                size = self._file_size.get(loc.file, 0)
                self._file_size[loc.file] = max(size, loc.off + loc.length)
                self.file_bytes += self._file_size[loc.file] - size
        elif op == "drop":
            for key in r["keys"]:
                emptied += self._forget(PageKey(key))
        elif op == "meta":
            self._meta[r["name"]] = r["value"]
        elif op == "unmeta":
            self._meta.pop(r["name"], None)
        self.counters.pages = len(self._locs)
        return emptied

    def _forget(self, key: PageKey) -> list[str]:
        """Drop `key` from the index; returns the extent files that are now empty."""
        chain = self._locs.pop(key, None)
        if chain is None:
            return []
        self.counters.bytes -= chain[0].kv_bytes
        emptied = []
        for loc in chain:
            self._file_live[loc.file] -= loc.length
            self._live_bytes -= loc.length
            if self._file_live[loc.file] == 0:
                self.file_bytes -= self._file_size.pop(loc.file)
                del self._file_live[loc.file]
                emptied.append(loc.file)
        return emptied

    def _maybe_reclaim(self) -> None:
        """Rewrite the live pages of the emptiest extents (under half live) into new extents
        when dead bytes dominate, emptiest first, until the files are back under
        `SPACE_FACTOR` x the live bytes. A file with a page that fails its checksum is left
        as it is (its good pages stay served, the bad one stays a miss); a failed write
        (disk full) stops the reclaim and leaves the old files as they were."""
        live, total = self._live_bytes, self.file_bytes
        if (
            self._reclaiming
            or total - live < self.reclaim_min_bytes
            or total <= SPACE_FACTOR * live
        ):
            return
        by_file = self._keys_by_file()
        emptiest = sorted(by_file, key=lambda f: self._file_live[f] / self._file_size[f])
        self._reclaiming = True
        try:
            for name in emptiest:
                if total <= SPACE_FACTOR * live:
                    break
                if name not in self._file_live:  # emptied by rewriting a chain through it
                    continue
                if 2 * self._file_live[name] > self._file_size[name]:
                    break  # the rest are more than half live: rewriting them gains little
                keys = [k for k in by_file[name] if any(c.file == name for c in self._locs[k])]
                pages = [(k, self._read_page(k)) for k in keys]
                good = [(k, p) for k, p in pages if p is not None]
                if len(good) < len(pages):
                    continue
                before = self.counters.bytes_written
                try:
                    self.write(good)
                except TierError:
                    break
                self.reclaimed_files += 1
                self.reclaim_bytes += self.counters.bytes_written - before
                total = self.file_bytes
        finally:
            self._reclaiming = False

    def _pieces_by_file(self) -> dict[str, list[tuple[PageKey, _Loc]]]:
        """Every live piece, by extent file, files in the order they were written (a chain's
        pieces are in increasing files, so replaying in this order rebuilds every chain)."""
        by_file: dict[str, list[tuple[PageKey, _Loc]]] = {}
        for key, chain in self._locs.items():
            for loc in chain:
                by_file.setdefault(loc.file, []).append((key, loc))
        return dict(sorted(by_file.items()))

    def _keys_by_file(self) -> dict[str, list[PageKey]]:
        return {f: [k for k, _ in pieces] for f, pieces in self._pieces_by_file().items()}

    def _rewrite_journal(self) -> None:
        lines = [
            journal.line({"op": "put", "file": f, "pages": [_entry(k, loc) for k, loc in pieces]})
            for f, pieces in self._pieces_by_file().items()
        ]
        lines += [
            journal.line({"op": "meta", "name": n, "value": v}) for n, v in self._meta.items()
        ]
        self._write_file(self.folder / JOURNAL, b"".join(lines))
        self._sync_dir(self.folder)
        self._lines = len(lines)

    def _maybe_compact(self) -> None:
        """Rewrite the journal from the index once dead lines dominate it. The rewrite is
        write-then-rename: a kill leaves the old journal or the new one, both complete. A
        failure (disk full) keeps the old journal and is counted; the tier keeps working."""
        live = len(self._file_live) + len(self._meta)
        if self._lines < max(self.compact_lines, COMPACT_FACTOR * live):
            return
        self._close_journal()
        try:
            self._rewrite_journal()
            self.compactions += 1
        except OSError:
            self.counters.failed_writes += 1
        try:
            self._open_journal()
        except OSError:  # (folder gone) later appends retry, and fail as I/O errors until then
            self.counters.failed_writes += 1

    # ---- the Tier interface ----

    def write(
        self,
        pages: Sequence[tuple[PageKey, PageData]],
        deltas: Mapping[PageKey, Sequence[int]] | None = None,
        owned: bool = False,  # pages are serialized: the caller's tensors are never kept
    ) -> None:
        held = sum(self._locs[k][0].kv_bytes for k, _ in pages if k in self._locs)
        self._check_room(pages, held)
        name = f"{self._next:010d}.ext"
        self._next += 1
        blobs: list[memoryview] = []
        entries, off, n_deltas = [], 0, 0
        for key, page in pages:
            slots = None if deltas is None else deltas.get(key)
            if slots is not None:
                slots = sorted(set(slots))
                chain = self._locs.get(key)
                if chain is None or not _chain_ok(chain, page, slots):
                    slots = None  # no copy to build on, or the chain is long: whole page
            parts = _page_parts(page, slots)
            crc = 0
            for part in parts:
                crc = zlib.crc32(part, crc)  # the crc of the parts back to back
            dtype = str(page.keys.dtype).removeprefix("torch.")
            shape = list(page.keys.shape)
            if slots is not None:
                shape[1] = len(slots)
                n_deltas += 1
            loc = _Loc(name, off, (shape[0], shape[1], shape[2], shape[3]), dtype,
                       crc, None if slots is None else tuple(slots))  # fmt: skip
            entries.append(_entry(key, loc))
            blobs += parts
            off += sum(part.nbytes for part in parts)
        line = journal.line({"op": "put", "file": name, "pages": entries})
        final = self.folder / "extents" / name
        t0 = time.perf_counter()
        try:
            self._write_file(final, blobs)
            self._sync_dir(final.parent)  # the rename is durable before the line names it
            self._append(line)
        except OSError as e:
            self.counters.write_s += time.perf_counter() - t0
            self.counters.failed_writes += 1
            final.unlink(missing_ok=True)
            raise TierError(
                f"disk tier: writing {len(pages)} pages to {self.folder} failed "
                f"({os.strerror(e.errno) if e.errno else e}); the pages stay in the tiers above"
            ) from e
        self.counters.write_s += time.perf_counter() - t0
        # the journal now points at the new extent: files it emptied are garbage
        for empty in self._apply({"op": "put", "file": name, "pages": entries}):
            (self.folder / "extents" / empty).unlink(missing_ok=True)
        self._count_write(pages, 0, off + len(line))
        self.counters.delta_writes += n_deltas
        self.counters.peak_bytes = max(self.counters.peak_bytes, self.counters.bytes)
        self._maybe_compact()
        self._maybe_reclaim()

    def read(self, key: PageKey) -> PageData | None:
        t0 = time.perf_counter()
        page = self._read_page(key)
        if page is None and key in self._locs:
            self.counters.corrupt += 1
        elif page is not None:
            self.counters.loads += 1
        self.counters.read_s += time.perf_counter() - t0
        return page

    def _read_page(self, key: PageKey) -> PageData | None:
        chain = self._locs.get(key)
        if chain is None:
            return None
        page = self._read_piece(chain[0])
        for loc in chain[1:]:
            delta = self._read_piece(loc)
            if page is None or delta is None:
                return None
            page.place(loc.slots or (), delta)
        return page

    def _read_piece(self, loc: _Loc) -> PageData | None:
        """One piece read into one buffer; keys and values are tensors over it (no copy)."""
        blob = bytearray(loc.length)
        try:
            with open_nofollow(self.folder / "extents" / loc.file) as f:
                f.seek(loc.off)
                got = f.readinto(blob)
        except OSError:
            got = -1
        if got != loc.length or zlib.crc32(blob) != loc.crc:
            return None
        dtype = getattr(torch, loc.dtype)
        half = loc.kv_bytes // 2
        count = half // _itemsize(loc.dtype)
        keys = torch.frombuffer(blob, dtype=dtype, count=count).reshape(loc.shape)
        values = torch.frombuffer(blob, dtype=dtype, count=count, offset=half).reshape(loc.shape)
        # positions copied out: 2 * half need not be a multiple of 8 (int64's alignment)
        positions = torch.frombuffer(blob[2 * half :], dtype=torch.int64)
        return PageData(keys, values, positions)

    def drop(self, keys: Sequence[PageKey]) -> None:
        keys = [k for k in keys if k in self._locs]
        if not keys:
            return
        self._try_append(journal.line({"op": "drop", "keys": list(keys)}))
        for empty in self._apply({"op": "drop", "keys": list(keys)}):
            (self.folder / "extents" / empty).unlink(missing_ok=True)
        self._maybe_compact()
        self._maybe_reclaim()

    def __contains__(self, key: object) -> bool:
        return key in self._locs

    def page_keys(self) -> list[PageKey]:
        return list(self._locs)

    def page_size_of(self, key: PageKey) -> tuple[int, int]:
        """(tokens, K/V bytes) of a stored page, from the index."""
        base = self._locs[key][0]
        return base.shape[1], base.kv_bytes

    # ---- opaque metadata (the store's segment index) ----

    @property
    def meta(self) -> Mapping[str, Any]:
        return self._meta

    def put_meta(self, name: str, value: Any) -> None:
        self._try_append(journal.line({"op": "meta", "name": name, "value": value}))
        self._meta[name] = value
        self._maybe_compact()

    def drop_meta(self, name: str) -> None:
        if name in self._meta:
            self._try_append(journal.line({"op": "unmeta", "name": name}))
            del self._meta[name]
            self._maybe_compact()

    # ---- file helpers ----

    def _try_append(self, line: bytes) -> None:
        """Index changes that need no page data: a failure is counted, the index stays right
        in memory, and a restart replays the older state (which the store reconciles)."""
        try:
            self._append(line)
        except OSError:
            self.counters.failed_writes += 1

    def _open_journal(self) -> None:
        self._journal = open_nofollow(self.folder / JOURNAL, "ab")  # lives with the tier

    def _close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    def _append(self, line: bytes) -> None:
        if self._journal is None:
            self._open_journal()  # an OSError here is the caller's, as a failed write would be
        assert self._journal is not None
        self._journal.write(line)
        self._lines += 1
        self._journal.flush()
        if self.fsync:
            os.fsync(self._journal.fileno())

    def _write_file(self, path: Path, data: bytes | Sequence[memoryview]) -> None:
        """Replace `path` with `data` (bytes, or buffers back to back) through `<stem>.tmp`,
        fsynced when the tier fsyncs; on a failure the temporary file is gone."""
        write_atomic(path, data, fsync=self.fsync, tmp=path.with_suffix(".tmp"))

    def _sync_dir(self, folder: Path) -> None:
        if self.fsync:
            sync_dir(folder)

    def drop_os_cache(self) -> None:
        """Ask the OS to evict the extent files from its page cache, so the next reads come
        from the device (a measurement aid; advisory, Linux only)."""
        if not hasattr(os, "posix_fadvise"):
            return
        for name in self._file_live:
            fd = os.open(self.folder / "extents" / name, os.O_RDONLY | NOFOLLOW)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close the journal and release the folder to the next process."""
        self._close_journal()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
