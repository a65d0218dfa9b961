"""The connector's worker side, past vLLM's layout checks (no vLLM): each step's work runs
through its request's mode, and each request's `RequestStats` of the step go back to the
scheduler (and into its report file, `reports.py`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from agentcache.engines.vllm.modes import Modes, RequestWork
from agentcache.engines.vllm.reports import ReportBook, RequestStats
from agentcache.engines.vllm.transfer import PagedKV
from agentcache.errors import AgentCacheError

logger = logging.getLogger(__name__)


class ConnectorWorker:
    """`paged` is set once vLLM registered its KV caches."""

    def __init__(self, modes: Modes, block_size: int, report_folder: Path) -> None:
        self.modes = modes
        self.block_size = block_size
        self.paged: PagedKV | None = None
        self.reports = ReportBook(report_folder)
        self._step_stats: dict[str, RequestStats] = {}
        self._failed_blocks: set[int] = set()
        # per request: the first token its loads left not full recompute's, until its save
        self._inexact_from: dict[str, int] = {}

    def load(self, work: Sequence[RequestWork], finished: Sequence[str]) -> None:
        """Fill every claimed span of the step, synchronously."""
        self.reports.forget(finished)
        for req_id in finished:
            self._inexact_from.pop(req_id, None)
        for w in work:
            if w.spec.report:
                self.reports.remember(w.req_id, w.spec.report)
            if w.load is not None:
                self._load(w)

    def _load(self, work: RequestWork) -> None:
        assert self.paged is not None and work.load is not None, "register_kv_caches was not called"
        mode = self.modes.named(work.mode)
        start, end = work.load
        t0 = time.perf_counter()
        try:
            loaded = mode.load(self.paged, work)
            done, failed = loaded.stats, set(loaded.failed_blocks)
            if loaded.inexact_from is not None:
                old = self._inexact_from.get(work.req_id, loaded.inexact_from)
                self._inexact_from[work.req_id] = min(old, loaded.inexact_from)
        except AgentCacheError as e:  # vLLM recomputes the span: one request's problem
            logger.warning("agentcache: request %s: %s; vLLM recomputes it", work.req_id, e)
            reason = f"fill failed ({e}): vLLM recomputed the span"
            done = RequestStats(mode.name, fallbacks=1, fallback_reasons=(reason,))
            failed = set(self._blocks_of(work))
        self._failed_blocks |= failed
        fill_ms = (time.perf_counter() - t0) * 1e3
        claimed = RequestStats(mode.name, claimed_tokens=end - start, fill_ms=fill_ms)
        self._count(work.req_id, claimed.merge(done))

    def _count(self, req_id: str, stats: RequestStats) -> None:
        old = self._step_stats.get(req_id)
        self._step_stats[req_id] = stats if old is None else old.merge(stats)

    def _blocks_of(self, work: RequestWork) -> list[int]:
        assert work.load is not None
        start, end = work.load
        bs = self.block_size
        return work.block_ids[start // bs : -(-end // bs)]

    def save(self, work: Sequence[RequestWork]) -> None:
        """After the forward pass: store the prompts whose prefill completed."""
        for w in work:
            if w.save and self.paged is not None:
                mode = self.modes.named(w.mode)
                written = mode.save(self.paged, w, self._inexact_from.pop(w.req_id, None))
                self._count(w.req_id, RequestStats(mode.name, stored_entries=written))

    def load_errors(self) -> set[int]:
        """The blocks that could not be loaded since the last call (vLLM recomputes them)."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def step_stats(self) -> dict[str, RequestStats]:
        """Each request's stats of the step (also added to its report file); then reset."""
        stats, self._step_stats = self._step_stats, {}
        for req_id, s in stats.items():  # vLLM finishes a request before the worker's last word
            self.reports.write(req_id, s)
        return stats
