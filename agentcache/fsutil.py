"""Writing files so a reader sees the old content or the new, whole, never a part; opening
files in a folder the process owns without following a link planted there."""

from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

# a symbolic link in the last component fails with ELOOP instead of being followed
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_nofollow(path: Path, mode: str = "rb") -> io.BufferedIOBase:
    """`open(path, mode)` for "rb", "wb", "ab" or "a+b", except that a symbolic link at `path`
    is an OSError (ELOOP) rather than a file elsewhere opened in its place."""
    flags = {
        "rb": os.O_RDONLY,
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "a+b": os.O_RDWR | os.O_CREAT | os.O_APPEND,
    }[mode]
    fd = os.open(path, flags | NOFOLLOW, 0o644)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):  # (fdopen would name the fd, not the path)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        return cast(io.BufferedIOBase, os.fdopen(fd, mode))  # (mode is a str, not a literal)
    except BaseException:
        os.close(fd)
        raise


def links_among(paths: Iterable[Path]) -> list[Path]:
    """The paths that exist as symbolic links (not followed: `lstat`)."""
    found = []
    for path in paths:
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                found.append(path)
        except FileNotFoundError:
            continue
    return found


def write_atomic(
    path: Path,
    data: bytes | Sequence[bytes | memoryview],
    *,
    fsync: bool = True,
    tmp: Path | None = None,
) -> None:
    """Replace `path` with `data` (bytes, or buffers back to back): written to a temporary
    file in the same folder (`tmp`, or a fresh hidden name), fsynced when `fsync`, then
    renamed over `path`. On any failure the temporary file is removed and the error raised;
    `path` keeps its old content. The folder itself is not fsynced: `sync_dir` does that.
    A symbolic link planted at `tmp` is an OSError (ELOOP), never written through."""
    if tmp is None:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        f: io.BufferedIOBase = os.fdopen(fd, "wb")
        tmp = Path(name)
    else:
        f = open_nofollow(tmp, "wb")  # closed below, before the rename
    try:
        with f:
            for part in [data] if isinstance(data, bytes) else data:
                f.write(part)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sync_dir(folder: Path) -> None:
    """fsync a folder, so the names created or renamed in it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
