"""A segment store several processes share: agentcache's `SegmentStore` in memory, written
through to a folder of checksummed files.

vLLM runs its scheduler and its workers in processes of their own, and several engines may
serve one fleet; all of them find a segment by the same content key (model + tokenizer + token
ids), so a file named by that key is the simplest shared tier. Each file is

    blake2b-256 digest (32 bytes) | torch.save({keys, values, positions, meta})

written to a temporary name and renamed, so a reader never sees half a file. A file whose
digest does not match its bytes is a miss (`MissReason.CHECKSUM`), counted, and never served.
The memory tier in front is the ordinary byte-bounded `SegmentStore` with its eviction policy.

Next to each entry, `<key>.meta` (JSON: the context it was computed after and its positions)
lets a process plan a prompt without reading the KV (`meta`): a staged prefill decides which
tokens vLLM computes from it (`stages.py`). It is a hint: the KV file stays the truth, and a
missing or unreadable meta file only makes the plan assume the least (not exact, no span).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.kv.store import Lookup, MissReason, SegmentKey, SegmentStore, StoredKV, _digest

_DIGEST = 32


@dataclass(frozen=True)
class StoredMeta:
    """What a plan needs to know of a stored segment, read without its KV."""

    context_id: str | None
    positions: torch.Tensor | None  # None: unknown (no readable meta file)


class FolderSegmentStore(SegmentStore):
    """`SegmentStore` whose entries also live in `folder`, visible to every process."""

    def __init__(self, folder: Path, capacity_bytes: int, policy: str = "lru") -> None:
        super().__init__(capacity_bytes, policy)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.checksum_failures = 0
        self.folder_hits = 0
        self.folder_writes = 0

    def _path(self, model_id: str, tokenizer_id: str, cid: str) -> Path:
        key = SegmentKey(_digest(model_id, tokenizer_id, cid))
        return self.folder / key[:2] / f"{key}.kv"

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        found = super().lookup_content(model_id, tokenizer_id, cid)
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
        self.folder_hits += 1
        with self._lock:  # the miss above was counted; this is a hit of the folder tier
            self.stats.misses -= 1
            self.stats.hits += 1
        super().put_content(cid, kv)
        return Lookup(kv, None)

    def meta(self, model_id: str, tokenizer_id: str, cid: str) -> StoredMeta | None:
        """The stored segment's context and positions (None: not stored)."""
        key = SegmentKey(_digest(model_id, tokenizer_id, cid))
        with self._lock:
            kv = self._entries.get(key)
        if kv is not None:
            return StoredMeta(kv.context_id, kv.positions)
        path = self._path(model_id, tokenizer_id, cid)
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.with_suffix(".meta").read_text(encoding="utf-8"))
            start, n = int(raw["start"]), int(raw["num_tokens"])
            listed = raw.get("positions")
            positions = torch.arange(start, start + n) if listed is None else torch.tensor(listed)
            if len(positions) != n:
                raise ValueError("positions do not match num_tokens")
            return StoredMeta(raw["context_id"] or None, positions)
        except (OSError, ValueError, KeyError, TypeError):
            return StoredMeta(None, None)

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        return super().contains_content(model_id, tokenizer_id, cid) or (
            self._path(model_id, tokenizer_id, cid).is_file()
        )

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        path = self._path(kv.model_id, kv.tokenizer_id, cid)
        if not path.is_file():
            self._write(path, kv)
        return super().put_content(cid, kv)

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
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.blake2b(payload, digest_size=_DIGEST).digest())
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.folder_writes += 1
        _write_atomic(path.with_suffix(".meta"), json.dumps(_meta_json(kv)).encode())

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
            obj = torch.load(io.BytesIO(payload), weights_only=True)
            meta = obj["meta"]
            return StoredKV(
                obj["keys"], obj["values"], obj["positions"], meta["model_id"],
                meta["tokenizer_id"], meta["context_id"] or None,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, RuntimeError):
            return None


def _meta_json(kv: StoredKV) -> dict[str, Any]:
    n = kv.num_tokens
    start = int(kv.positions[0]) if n else 0
    natural = bool(torch.equal(kv.positions, torch.arange(start, start + n)))
    meta: dict[str, Any] = {"num_tokens": n, "start": start, "context_id": kv.context_id or ""}
    if not natural:
        meta["positions"] = kv.positions.tolist()
    return meta


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
