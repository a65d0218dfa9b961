"""A segment store several processes share: a `MemorySegmentStore` in front, written
through to a folder of checksummed files (an implementation of the `SegmentStore` seam).

vLLM runs its scheduler and its workers in processes of their own, and several engines may
serve one fleet; all of them find a segment by the same content key (model + tokenizer + token
ids), so a file named by that key is the simplest shared tier. Each file is

    blake2b-256 digest (32 bytes) | torch.save({keys, values, positions, meta})

written to a temporary name and renamed, so a reader never sees half a file. A file whose
digest does not match its bytes is a miss (`MissReason.CHECKSUM`), counted, and never served.
The memory tier in front is the ordinary byte-bounded `MemorySegmentStore` with its eviction
policy; `stats` are its counters, with a lookup the folder serves counted as a hit.

Next to each entry, `<key>.meta` (`<blake2b of the JSON> <JSON>`: the context it was computed
after, its positions, and the digest of the KV file it describes) lets a process plan a prompt
without reading the KV (`meta`): a staged prefill decides which tokens vLLM computes from it
(`stages.py`). A meta file that fails its own checksum, or names another KV file's digest, is
a miss counted as a checksum failure (never used to plan); a missing one only makes the plan
assume the least (not exact, no span).

The folder is bounded by `folder_bytes` (the connector's setting; a store that only reads
leaves it None): each process adds what it writes to its estimate of
the folder's size and, past the bound, scans the folder and deletes the least recently used
entries (by modification time; a folder hit refreshes it) until it is under `LOW_WATER` of
it. Several writers may overshoot the bound by what they wrote since their last scan.

Retention (`RetainingStore`): a process that retains entries (the server, across a tool
pause) writes `<key>.pin` beside each, holding the wall-clock time (`time.time`, which every
process reads alike) the pin expires at; every process's eviction scan passes over an entry
whose pin has not expired, and deletes an expired pin with its entry. The bounds on pinned
bytes (a share of `folder_bytes`, a tenant's part of it) are kept by the retaining process's
own pin table: pins are taken in one process only. A pin file that does not parse protects
nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentcache.fsutil import open_nofollow, write_atomic
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.retention import (
    PinResult,
    PinTable,
    RetainingStore,
    RetentionStats,
    check_shares,
)
from agentcache.kv.store import (
    Lookup,
    MissReason,
    SegmentStore,
    StoredKV,
    StoreStats,
    store_key,
)

_DIGEST = 32
LOW_WATER = 0.9  # an eviction scan deletes down to this share of folder_bytes


@dataclass(frozen=True)
class StoredMeta:
    """What a plan needs to know of a stored segment, read without its KV."""

    context_id: str | None
    positions: torch.Tensor | None  # None: unknown (no readable meta file)


class FolderSegmentStore(SegmentStore, RetainingStore):
    """A `MemorySegmentStore` of `capacity_bytes` whose entries also live in `folder`,
    visible to every process. A put writes the folder first, so an entry the memory tier
    rejects (False) is still in the folder. `clear()` empties both (the folder's files are
    deleted, for every process). Retained entries are pinned in the folder (module
    docstring); `clock` is the wall clock pins expire on."""

    def __init__(
        self,
        folder: Path,
        capacity_bytes: int,
        policy: str = "lru",
        folder_bytes: int | None = None,  # None: this process never evicts the folder
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        # pins taken by this process; bounded by a share of folder_bytes (set_retain_share;
        # none until then); a folder without a bound is never evicted, so any pin fits
        self.retained = PinTable(0)
        self.memory = MemorySegmentStore(capacity_bytes, policy)
        self._lock = threading.Lock()  # guards folder_hits, which `stats` reads
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder_bytes = folder_bytes
        self.checksum_failures = 0  # KV or meta files that failed their checks (misses)
        self.folder_hits = 0
        self.folder_writes = 0
        self.folder_evictions = 0  # entries deleted to keep the folder within folder_bytes
        self._folder_estimate = 0
        if folder_bytes is not None:
            self._evict_folder()

    @property
    def capacity_bytes(self) -> int:  # type: ignore[override]
        return self.memory.capacity_bytes

    @property
    def stats(self) -> StoreStats:  # type: ignore[override]
        """The memory tier's counters, a lookup the folder served counted as a hit (a copy)."""
        m = self.memory.stats
        return replace(m, hits=m.hits + self.folder_hits, misses=m.misses - self.folder_hits)

    def _path(self, model_id: str, tokenizer_id: str, cid: str) -> Path:
        key = store_key(model_id, tokenizer_id, cid)
        return self.folder / key[:2] / f"{key}.kv"

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        found = self.memory.lookup_content(model_id, tokenizer_id, cid)
        if found.hit:
            return found
        path = self._path(model_id, tokenizer_id, cid)
        if not path.is_file():
            return found
        kv = self._read(path)
        if kv is None:
            self.checksum_failures += 1
            return Lookup(None, MissReason.CHECKSUM)
        if (kv.model_id, kv.tokenizer_id) != (model_id, tokenizer_id):
            return Lookup(None, MissReason.OTHER_MODEL)
        with self._lock:  # the memory tier counted a miss: `stats` makes it a hit
            self.folder_hits += 1
        _touch(path)
        self.memory.put_content(cid, kv)
        return Lookup(kv, None)

    def meta(self, model_id: str, tokenizer_id: str, cid: str) -> StoredMeta | None:
        """The stored segment's context and positions (None: not stored, or a meta file
        that fails its checks: counted in `checksum_failures`)."""
        kv = self.memory.peek_content(model_id, tokenizer_id, cid)
        if kv is not None:
            return StoredMeta(kv.context_id, kv.positions)
        path = self._path(model_id, tokenizer_id, cid)
        try:
            raw = path.with_suffix(".meta").read_bytes()
        except OSError:  # no meta file: the plan assumes the least
            return StoredMeta(None, None) if path.is_file() else None
        found = _parse_meta(raw, _kv_digest(path))
        if found is None:
            self.checksum_failures += 1
        return found

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        return self.memory.contains_content(model_id, tokenizer_id, cid) or (
            self._path(model_id, tokenizer_id, cid).is_file()
        )

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        path = self._path(kv.model_id, kv.tokenizer_id, cid)
        if not path.is_file():
            self._write(path, kv)
        return self.memory.put_content(cid, kv)

    def clear(self) -> None:
        """Empty the memory tier and delete every entry's files (pins too) from the folder."""
        self.memory.clear()
        for path in self.folder.glob("*/*.kv"):
            _delete(path)
        with self._lock:
            self.retained.clear()
        self._folder_estimate = 0

    # ---- retention (RetainingStore) ----

    def retain(
        self, model_id: str, tokenizer_id: str, cids: Sequence[str], seconds: float,
        owner: Hashable = None,
    ) -> PinResult:  # fmt: skip
        sizes, absent = [], []
        for cid in cids:
            path = self._path(model_id, tokenizer_id, cid)
            try:
                sizes.append((path, path.stat().st_size + _size(path.with_suffix(".meta"))))
            except OSError:  # not in the folder (never stored, or evicted)
                absent.append(path)
        with self._lock:
            got = self.retained.pin(sizes, seconds, self.clock(), owner)
            for key in got.preempted:  # ended for another tenant's reservation
                Path(str(key)).with_suffix(".pin").unlink(missing_ok=True)
            for key in got.pinned:
                path = Path(str(key))
                until = max(got.until, _pinned_until(path) or 0.0)
                write_atomic(path.with_suffix(".pin"), f"{until!r}\n".encode(), fsync=False)
        return replace(got, refused=(*got.refused, *absent))

    def release(self, model_id: str, tokenizer_id: str, cids: Sequence[str]) -> None:
        paths = [self._path(model_id, tokenizer_id, c) for c in cids]
        with self._lock:
            self.retained.unpin(paths)
            for path in paths:
                path.with_suffix(".pin").unlink(missing_ok=True)

    def set_retain_share(
        self, share: float, owner_share: float = 1.0, owner_reserve: float = 0.0
    ) -> None:
        check_shares(share, owner_share, owner_reserve)
        bound = sys.maxsize if self.folder_bytes is None else int(share * self.folder_bytes)
        with self._lock:
            self.retained.bound(bound if share > 0 else 0, owner_share, owner_reserve)

    def retention_stats(self) -> RetentionStats:
        with self._lock:
            return self.retained.stats(self.clock())

    def _write(self, path: Path, kv: StoredKV) -> None:
        buf = io.BytesIO()
        meta = {"model_id": kv.model_id, "tokenizer_id": kv.tokenizer_id}
        meta["context_id"] = kv.context_id or ""
        torch.save(
            {"keys": kv.keys.contiguous(), "values": kv.values.contiguous(),
             "positions": kv.positions.contiguous(), "meta": meta},
            buf,
        )  # fmt: skip
        payload = buf.getvalue()
        digest = hashlib.blake2b(payload, digest_size=_DIGEST).digest()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, digest + payload, fsync=False)
        self.folder_writes += 1
        body = json.dumps(_meta_json(kv) | {"kv_digest": digest.hex()}).encode()
        meta_file = _checksummed(body)
        write_atomic(path.with_suffix(".meta"), meta_file, fsync=False)
        self._folder_estimate += _DIGEST + len(payload) + len(meta_file)
        if self.folder_bytes is not None and self._folder_estimate > self.folder_bytes:
            self._evict_folder()

    def _evict_folder(self) -> None:
        """Delete the least recently used entries until the folder is under `LOW_WATER` x
        `folder_bytes` (when it is over the bound); re-measure the folder either way."""
        entries = []
        for path in self.folder.glob("*/*.kv"):
            try:
                st = path.stat()
                size = st.st_size + _size(path.with_suffix(".meta"))
            except OSError:  # deleted by another process meanwhile
                continue
            entries.append((st.st_mtime_ns, size, path))
        total = sum(size for _, size, _ in entries)
        bound = self.folder_bytes
        if bound is not None and total > bound:
            now = self.clock()
            for _, size, path in sorted(entries):
                if total <= LOW_WATER * bound:
                    break
                if (_pinned_until(path) or 0.0) > now:  # retained: passed over
                    continue
                _delete(path)
                total -= size
                self.folder_evictions += 1
        self._folder_estimate = total

    @staticmethod
    def _read(path: Path) -> StoredKV | None:
        """The entry in `path`, or None when its bytes fail the checksum or do not parse."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        digest, payload = data[:_DIGEST], data[_DIGEST:]
        if hashlib.blake2b(payload, digest_size=_DIGEST).digest() != digest:
            return None
        try:
            return _entry(torch.load(io.BytesIO(payload), weights_only=True))
        except Exception:  # a payload that passed its checksum but is not an entry: any error
            return None


def _entry(obj: Any) -> StoredKV | None:
    """The entry a KV file's payload holds, if it is one `_write` writes: K/V of one shape
    (L, n, H, D), n positions, string ids."""
    keys, values, positions, meta = (obj.get(k) for k in ("keys", "values", "positions", "meta"))
    if not all(isinstance(t, torch.Tensor) for t in (keys, values, positions)):
        return None
    if keys.dim() != 4 or keys.shape != values.shape or positions.shape != (keys.shape[1],):
        return None
    ids = [meta.get(k) for k in ("model_id", "tokenizer_id", "context_id")]
    if not all(isinstance(i, str) for i in ids):
        return None
    return StoredKV(keys, values, positions, ids[0], ids[1], ids[2] or None)


def _checksummed(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=_DIGEST).hexdigest().encode() + b" " + body


def _kv_digest(path: Path) -> bytes | None:
    """The digest a KV file starts with (None: no such file)."""
    try:
        with open(path, "rb") as f:
            return f.read(_DIGEST)
    except OSError:
        return None


def _parse_meta(raw: bytes, kv_digest: bytes | None) -> StoredMeta | None:
    """A meta file's content, if its checksum holds and it describes the KV file whose digest
    is `kv_digest`; else None."""
    body = raw.partition(b" ")[2]
    if kv_digest is None or _checksummed(body) != raw:
        return None
    try:
        meta = json.loads(body)
        if bytes.fromhex(meta["kv_digest"]) != kv_digest:
            return None
        start, n = int(meta["start"]), int(meta["num_tokens"])
        listed = meta.get("positions")
        positions = torch.arange(start, start + n) if listed is None else torch.tensor(listed)
        if positions.dim() != 1 or len(positions) != n:
            return None
        return StoredMeta(str(meta["context_id"]) or None, positions)
    except (ValueError, KeyError, TypeError, RuntimeError):
        return None


def _delete(path: Path) -> None:
    """An entry's files: its KV, meta and pin."""
    for suffix in (".kv", ".meta", ".pin"):
        path.with_suffix(suffix).unlink(missing_ok=True)


def _pinned_until(path: Path) -> float | None:
    """When the pin on the entry at `path` expires (wall clock); None: no pin, or one that does
    not parse (it protects nothing)."""
    try:
        with open_nofollow(path.with_suffix(".pin")) as f:
            raw = f.read(64)
        until = float(raw.decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return until if math.isfinite(until) else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # evicted meanwhile
        os.utime(path)


def _meta_json(kv: StoredKV) -> dict[str, Any]:
    n = kv.num_tokens
    start = int(kv.positions[0]) if n else 0
    natural = bool(torch.equal(kv.positions, torch.arange(start, start + n)))
    meta: dict[str, Any] = {"num_tokens": n, "start": start, "context_id": kv.context_id or ""}
    if not natural:
        meta["positions"] = kv.positions.tolist()
    return meta
