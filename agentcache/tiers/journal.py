"""The disk tier's journal lines and folder lock (mechanism only, no tier state).

A journal line is `<crc32 of json> <json>\\n`. `parse` returns the record of a line whose crc
matches, `check` says what is wrong with a record whose fields are not what the tier writes
(None: nothing), so a crafted or bit-flipped line never reaches the index: a file name must
be one of the tier's own extent names (`0000000007.ext`: no path separator, no `..`).

`FolderLock` is the one-writer rule: the tier holds an exclusive `flock` on `folder/lock`
for its life (released by `release`, or by the OS when the process ends) and writes its pid
there, so a second opener is told which process holds the folder.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import CacheDirError
from agentcache.fsutil import open_nofollow

EXTENT_NAME = re.compile(r"[0-9]{10}\.ext")
MAX_KEY_CHARS = 512
LOCK = "lock"


def line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"))
    return f"{zlib.crc32(body.encode()):08x} {body}\n".encode()


def parse(raw: bytes) -> dict[str, Any] | None:
    """The record of a whole line whose crc matches, else None."""
    try:
        crc, body = raw.decode().rstrip("\n").split(" ", 1)
        if int(crc, 16) != zlib.crc32(body.encode()):
            return None
        record = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _is_int(value: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_KEY_CHARS


def _is_dtype(name: Any) -> bool:
    return isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype)


def check_page(p: Any) -> str | None:
    """What is wrong with one page entry of a put record (None: nothing)."""
    if not isinstance(p, dict) or not _is_key(p.get("key")):
        return "a page entry without a page key"
    shape, slots = p.get("shape"), p.get("slots")
    if not (
        isinstance(shape, list) and len(shape) == 4 and all(_is_int(x, 0, 1 << 20) for x in shape)
    ):
        return f"page {p['key']!r:.60}: shape {str(shape)[:60]} is not 4 sizes"
    if not _is_int(p.get("off")) or not _is_int(p.get("crc"), 0, 1 << 32):
        return f"page {p['key']!r:.60}: offset or crc is not a non-negative integer"
    if not _is_dtype(p.get("dtype")):
        return f"page {p['key']!r:.60}: dtype {str(p.get('dtype'))[:40]!r} is not a torch dtype"
    if slots is not None and not (
        isinstance(slots, list)
        and len(slots) == shape[1]
        and all(_is_int(s, 0, 1 << 20) for s in slots)
    ):
        return f"page {p['key']!r:.60}: delta slots do not match its shape"
    return None


def check(record: dict[str, Any]) -> str | None:
    """What is wrong with a journal record (None: it is one the tier writes)."""
    op = record.get("op")
    if op == "put":
        name, pages = record.get("file"), record.get("pages")
        if not isinstance(name, str) or not EXTENT_NAME.fullmatch(name):
            return f"put names file {str(name)[:80]!r}, not one of the tier's extent names"
        if not isinstance(pages, list):
            return f"put of {name} has no page list"
        return next((f"put of {name}: {e}" for e in map(check_page, pages) if e), None)
    if op == "drop":
        keys = record.get("keys")
        ok = isinstance(keys, list) and all(_is_key(k) for k in keys)
        return None if ok else "drop without a list of page keys"
    if op in ("meta", "unmeta"):
        return None if _is_key(record.get("name")) else f"{op} without a name"
    return f"unknown journal operation {str(op)[:40]!r}"


class FolderLock:
    """An exclusive lock on a tier folder, held until `release` (or the process ends)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK
        # not through a link planted at `lock`: the pid written below would land elsewhere
        self._file: io.BufferedIOBase | None = open_nofollow(self.path, "a+b")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read(32).decode(errors="replace").strip() or "unknown"
            self._file.close()
            self._file = None
            raise CacheDirError(
                f"disk tier folder {folder} is in use by process {holder} (lock {self.path}); "
                "one process writes a folder: stop that one, or give this one another folder "
                "(disk_dir)"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n".encode())
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
