"""What the connector reports per request, and the worker's reports through the folder
every engine of a fleet shares.

    RequestStats     the worker's counters of one request, merged across steps and workers
                     (worker -> scheduler in the connector's worker metadata; worker -> backend
                     in the report file)
    SchedulerReport  what the scheduler returns in a finished request's kv_transfer_params

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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from agentcache.errors import AgentCacheError

MAX_REQUESTS = 4096
MAX_FILES = 1024
PRUNE_EVERY = 64  # report writes between two looks at the folder's size

MissRow = tuple[str | None, str, int, str]  # [segment id, kind, tokens, reason] in JSON
TokenRun = tuple[int, int, str]  # [start, end, token use] in JSON


@dataclass(frozen=True)
class RequestStats:
    """What the worker did for one request (in the request's kv_transfer_params and report).

    `merge` adds the counters, concatenates the lists and keeps the later `mode`: a request's
    stats are the merge of its steps' (and of its workers')."""

    mode: str = "prefix"
    claimed_tokens: int = 0  # tokens the connector filled (the rest: vLLM)
    reused_tokens: int = 0  # of those, cached KV (re-rotated where shifted)
    computed_tokens: int = 0  # of those, computed by agentcache's engine
    stored_entries: int = 0
    load_failures: int = 0
    fallbacks: int = 0
    fallback_reasons: tuple[str, ...] = ()
    misses: tuple[MissRow, ...] = ()
    fill_ms: float = 0.0
    # where the filled span's KV came from: runs [start, end, use] in prompt positions, `use`
    # a `TokenUse` value (exact, moved, refreshed, computed); empty where not known
    token_runs: tuple[TokenRun, ...] = ()

    def merge(self, other: RequestStats) -> RequestStats:
        return RequestStats(
            other.mode,
            self.claimed_tokens + other.claimed_tokens,
            self.reused_tokens + other.reused_tokens,
            self.computed_tokens + other.computed_tokens,
            self.stored_entries + other.stored_entries,
            self.load_failures + other.load_failures,
            self.fallbacks + other.fallbacks,
            self.fallback_reasons + other.fallback_reasons,
            self.misses + other.misses,
            self.fill_ms + other.fill_ms,
            self.token_runs + other.token_runs,
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: the fields in order, lists for the sequences."""
        out = asdict(self)
        out["fallback_reasons"] = list(self.fallback_reasons)
        out["misses"] = [list(m) for m in self.misses]
        out["token_runs"] = [list(r) for r in self.token_runs]
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RequestStats:
        """The inverse of `as_dict`; an unknown field is a `ReportError` naming it."""
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(raw) - known):
            raise ReportError(f"unknown request stats fields {unknown}; known: {sorted(known)}")
        body = dict(raw)
        body["fallback_reasons"] = tuple(body.get("fallback_reasons", ()))
        body["misses"] = tuple(tuple(m) for m in body.get("misses", ()))
        body["token_runs"] = tuple(tuple(r) for r in body.get("token_runs", ()))
        return cls(**body)


@dataclass(frozen=True)
class SchedulerReport:
    """The scheduler's word on a finished request: what it planned, the worker's stats that
    reached it, and its own findings under keys of their own (the worker's report file,
    merged over these by `VLLMBackend`, carries the worker's misses and fallbacks)."""

    mode: str
    vllm_cached_tokens: int
    planned_tokens: int
    worker: RequestStats | None = None
    scheduler_misses: tuple[MissRow, ...] = ()
    scheduler_fallback_reasons: tuple[str, ...] = ()
    preemptions: int = 0  # times vLLM preempted the request (its prompt computed again)

    def as_params(self) -> dict[str, Any]:
        """The request's kv_transfer_params (`{"agentcache": {...}}`)."""
        body: dict[str, Any] = {"mode": self.mode, "vllm_cached_tokens": self.vllm_cached_tokens}
        body["planned_tokens"] = self.planned_tokens
        if self.worker is not None:
            body |= self.worker.as_dict()
        body["scheduler_misses"] = [list(m) for m in self.scheduler_misses]
        body["scheduler_fallback_reasons"] = list(self.scheduler_fallback_reasons)
        body["preemptions"] = self.preemptions
        return {"agentcache": body}


class ReportError(AgentCacheError):
    """A request report that is not one the connector writes."""


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

    def write(self, req_id: str, stats: RequestStats) -> None:
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


def merge_counts(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Add counters, concatenate lists, keep the latest of anything else (the backend's
    per-turn JSON, over the reports of a staged prefill's requests)."""
    for key, value in more.items():
        old = into.get(key)
        if isinstance(value, int | float) and isinstance(old, int | float):
            into[key] = old + value
        elif isinstance(value, list) and isinstance(old, list):
            into[key] = [*old, *value]
        else:
            into[key] = value


def write_report(folder: Path, name: str, stats: RequestStats) -> None:
    """Add a request's worker-side counters to `folder/reports/name.json` (atomic rename)."""
    path = folder / "reports" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_report(folder, name, remove=False)
    merged = stats if old is None else old.merge(stats)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(merged.as_dict(), f)
    os.replace(tmp, path)


def read_report(folder: Path, name: str, remove: bool = True) -> RequestStats | None:
    """The request's report, or None when there is none (or it cannot be read)."""
    path = folder / "reports" / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if remove:
        path.unlink(missing_ok=True)
    return RequestStats.from_dict(data)
