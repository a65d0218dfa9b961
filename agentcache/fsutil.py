"""Writing files so a reader sees the old content or the new, whole, never a part."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path


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
    `path` keeps its old content. The folder itself is not fsynced: `sync_dir` does that."""
    if tmp is None:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        tmp, f = Path(name), os.fdopen(fd, "wb")
    else:
        f = open(tmp, "wb")  # noqa: SIM115 -- closed below, before the rename
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
