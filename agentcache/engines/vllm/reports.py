"""The worker's per-request reports, through the folder every engine of a fleet shares.

vLLM finishes a request (and returns its kv_transfer_params) before the worker's counters of
the request's last step reach the scheduler, so the worker adds them to
`folder/reports/<name>.json`, which the backend reads (and removes) once the request is done.
A report name comes with the request: `ReportBook` remembers it until the scheduler says the
request finished, holds at most `max_requests` names, and keeps the folder to the newest
`max_files` reports (files of clients that never read theirs).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAX_REQUESTS = 4096
MAX_FILES = 1024
PRUNE_EVERY = 64  # report writes between two looks at the folder's size


class ReportBook:
    """Request -> report name on the worker side, bounded; writes reports, prunes the folder."""

    def __init__(
        self, folder: Path, max_requests: int = MAX_REQUESTS, max_files: int = MAX_FILES
    ) -> None:
        self.folder = Path(folder)
        self.max_requests = max_requests
        self.max_files = max_files
        self._names: OrderedDict[str, str] = OrderedDict()
        self._writes = 0
        self.dropped_names = 0  # names forgotten to stay within max_requests
        self.pruned_files = 0

    def __len__(self) -> int:
        return len(self._names)

    def remember(self, req_id: str, name: str) -> None:
        self._names[req_id] = name
        self._names.move_to_end(req_id)
        while len(self._names) > self.max_requests:
            self._names.popitem(last=False)
            self.dropped_names += 1

    def forget(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._names.pop(req_id, None)

    def write(self, req_id: str, stats: dict[str, Any]) -> None:
        """Add `stats` to the request's report, if it asked for one."""
        name = self._names.get(req_id)
        if name is None:
            return
        write_report(self.folder, name, stats)
        self._writes += 1
        if self._writes % PRUNE_EVERY == 0:
            self.pruned_files += prune_reports(self.folder, self.max_files)


def prune_reports(folder: Path, keep: int) -> int:
    """Delete all but the newest `keep` report files. Returns how many were deleted."""
    try:
        files = sorted((folder / "reports").glob("*.json"), key=lambda f: f.stat().st_mtime)
    except OSError:  # a file removed by its reader while listing: next time
        return 0
    old = files[: max(0, len(files) - keep)]
    for f in old:
        f.unlink(missing_ok=True)
    return len(old)


def merge_counts(into: dict[str, Any], more: dict[str, Any]) -> None:
    """Add counters, concatenate lists, keep the latest of anything else."""
    for key, value in more.items():
        old = into.get(key)
        if isinstance(value, int | float) and isinstance(old, int | float):
            into[key] = old + value
        elif isinstance(value, list) and isinstance(old, list):
            into[key] = [*old, *value]
        else:
            into[key] = value


def write_report(folder: Path, name: str, stats: dict[str, Any]) -> None:
    """Add a request's worker-side counters to `folder/reports/name.json` (atomic rename)."""
    path = folder / "reports" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = read_report(folder, name, remove=False)
    merge_counts(merged, stats)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(merged, f)
    os.replace(tmp, path)


def read_report(folder: Path, name: str, remove: bool = True) -> dict[str, Any]:
    path = folder / "reports" / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if remove:
        path.unlink(missing_ok=True)
    return dict(data)
