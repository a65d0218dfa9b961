"""The connector's two sides without a running engine (no vLLM): the scheduler chooses a
request's mode once and reports what it claimed; on the worker a fill that fails is a counted
fallback whose blocks vLLM recomputes, and the report book forgets finished requests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentcache.engines.vllm.modes import (
    VLLM_FILLS_SEGMENTS,
    Modes,
    PrefixMode,
    RequestWork,
    SegmentMode,
    StagedMode,
    StoreKeys,
)
from agentcache.engines.vllm.plan import prefix_chunk_ids
from agentcache.engines.vllm.reports import RequestStats, read_report
from agentcache.engines.vllm.request import RequestSpec, SegmentSpan
from agentcache.engines.vllm.scheduler import ConnectorScheduler
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.engines.vllm.transfer import (
    Filled,
    PagedKV,
    PrefixTransfer,
    SegmentFiller,
    StoredRunLoader,
)
from agentcache.engines.vllm.worker import ConnectorWorker
from agentcache.errors import ContextLengthError
from agentcache.prompt.segments import SegmentKind
from agentcache.reuse.base import ReuseStats

BS = 32
SPANS = (SegmentSpan(SegmentKind.SYSTEM, 0, 40, "s"), SegmentSpan(SegmentKind.FIXED, 40, 80))


class FailingFiller:
    def fill(self, *args: Any) -> None:
        raise ContextLengthError(5000, 4096)


class BoundedFiller:
    """Fills nothing; each fill says its K/V stops being full recompute's at `bounds[i]`."""

    def __init__(self, *bounds: int | None) -> None:
        self.bounds = list(bounds)

    def fill(self, *args: Any) -> Filled:
        return Filled(ReuseStats(prompt_tokens=80, num_layers=1), self.bounds.pop(0))


class RecordingSegmentMode(SegmentMode):
    """Records the boundary each save is given instead of storing."""

    saved: list[int | None]

    def save(self, paged: PagedKV, work: RequestWork, inexact_from: int | None = None) -> int:
        self.saved.append(inexact_from)
        return 0


class PresentStore(FolderSegmentStore):
    """A folder store that claims to hold every content id in `present`."""

    present: set[str]

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        return cid in self.present


def _modes(store: FolderSegmentStore, filler: Any = None) -> Modes:
    keys = StoreKeys(store, "m", "t")

    def no_runs() -> StoredRunLoader:
        raise AssertionError("no staged run here")

    def fill() -> SegmentFiller:
        return filler  # type: ignore[no-any-return]

    return Modes(
        PrefixMode(PrefixTransfer(store, "m", "t"), BS),
        SegmentMode(keys, 0.5, None if filler is None else fill),
        StagedMode(keys, no_runs),
    )


def test_a_failed_fill_is_a_counted_fallback_and_vllm_recomputes_its_blocks(
    tmp_path: Path,
) -> None:
    worker = ConnectorWorker(_modes(FolderSegmentStore(tmp_path, 0), FailingFiller()), BS, tmp_path)
    worker.paged = object()  # type: ignore[assignment]  # the failing filler never touches it
    spec = RequestSpec(SPANS, "pic", report="rep1")
    work = RequestWork("r1", "segments", list(range(80)), [7, 8, 9, 4], spec, (16, 79), False)
    worker.load([work], [])
    assert worker.load_errors() == {7, 8, 9}  # tokens 16..78: blocks 0-2
    assert worker.load_errors() == set()
    stats = worker.step_stats()["r1"]
    assert (stats.mode, stats.fallbacks, stats.claimed_tokens) == ("segments", 1, 63)
    assert worker.step_stats() == {}
    report = read_report(tmp_path, "rep1")
    assert report is not None and report.fallbacks == 1 and report.claimed_tokens == 63
    assert "fill failed" in report.fallback_reasons[0] and "4096" in report.fallback_reasons[0]
    worker.load([], ["r1"])
    assert len(worker.reports) == 0


def _request(req_id: str, ids: list[int], spec: RequestSpec | None = None) -> Any:
    params = None if spec is None else spec.to_params()
    return SimpleNamespace(request_id=req_id, prompt_token_ids=ids, kv_transfer_params=params)


def _step(req_id: str, ids: list[int], blocks: list[int], computed: int) -> Any:
    new = SimpleNamespace(req_id=req_id, prompt_token_ids=ids, block_ids=(blocks,),
                          num_computed_tokens=computed)  # fmt: skip
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(),
                             num_computed_tokens=[])  # fmt: skip
    return SimpleNamespace(scheduled_new_reqs=[new], scheduled_cached_reqs=cached,
                           num_scheduled_tokens={req_id: len(ids) - computed})  # fmt: skip


def test_the_scheduler_claims_stored_prefix_blocks_and_reports_them(tmp_path: Path) -> None:
    store = PresentStore(tmp_path, 0)
    ids = list(range(100))
    store.present = set(prefix_chunk_ids(ids, BS)[:2])  # blocks 0 and 1 stored
    scheduler = ConnectorScheduler(_modes(store), "")
    assert scheduler.claim(_request("r", ids), 32) == 32  # vLLM holds block 0: block 1 left
    scheduler.allocated("r", 32)
    (work,) = scheduler.work(_step("r", ids, [5, 6, 7, 8], 32))
    assert (work.mode, work.load, work.save, work.block_ids) == ("prefix", (32, 64), True,
                                                                  [5, 6, 7, 8])  # fmt: skip
    scheduler.worker_stats({"r": RequestStats("prefix", claimed_tokens=32, stored_entries=1)})
    scheduler.worker_stats({"r": RequestStats("prefix", stored_entries=2)})
    body = scheduler.finished("r")["agentcache"]
    assert list(body)[:4] == ["mode", "vllm_cached_tokens", "planned_tokens", "claimed_tokens"]
    assert (body["vllm_cached_tokens"], body["planned_tokens"]) == (32, 32)
    assert (body["claimed_tokens"], body["stored_entries"]) == (32, 3)
    assert body["scheduler_misses"] == [] and body["scheduler_fallback_reasons"] == []
    assert len(scheduler) == 0


def test_the_scheduler_counts_a_requests_preemptions_in_its_report(tmp_path: Path) -> None:
    """Each preemption is in one step's `preempted_req_ids`; the request's report counts
    them; an id the connector does not hold (finished, or never seen) is ignored."""
    store = PresentStore(tmp_path, 0)
    store.present = set()
    scheduler = ConnectorScheduler(_modes(store), "")
    ids = list(range(40))
    scheduler.claim(_request("r", ids), 0)
    scheduler.work(_step("r", ids, [1, 2], 0))  # a step without the field: vLLM before it
    for preempted in ({"r", "gone"}, set(), {"r"}):
        step = _step("r", ids, [1, 2], 0)
        step.preempted_req_ids = preempted
        scheduler.work(step)
    body = scheduler.finished("r")["agentcache"]
    assert body["preemptions"] == 2
    scheduler.claim(_request("q", ids), 0)
    assert scheduler.finished("q")["agentcache"]["preemptions"] == 0


def test_a_segment_request_keeps_its_mode_and_says_why_vllm_computed_it(tmp_path: Path) -> None:
    store = PresentStore(tmp_path, 0)
    store.present = set()
    scheduler = ConnectorScheduler(_modes(store), "")  # fill='vllm': no filler
    ids = list(range(80))
    spec = RequestSpec(SPANS, "pic")
    assert scheduler.claim(_request("a", ids, spec), 0) == 0
    body = scheduler.finished("a")["agentcache"]
    assert body["mode"] == "segments" and body["scheduler_fallback_reasons"] == [
        VLLM_FILLS_SEGMENTS
    ]
    # a refused spec: served as prefix, the refusal reported
    bad = _request("b", ids)
    bad.kv_transfer_params = {"agentcache": {"segments": "nope"}}
    assert scheduler.claim(bad, 0) == 0
    body = scheduler.finished("b")["agentcache"]
    assert (
        body["mode"] == "prefix"
        and "segments must be a list" in body["scheduler_fallback_reasons"][0]
    )


def test_a_request_saves_with_the_least_boundary_its_loads_left(tmp_path: Path) -> None:
    """A prefill the scheduler split over steps loads more than once: its save stores the
    segments after the earliest token any load left not full recompute's as inexact; a
    request that ended before its save leaves nothing behind for the next one."""
    store = FolderSegmentStore(tmp_path, 0)
    keys = StoreKeys(store, "m", "t")
    filler = BoundedFiller(60, 45, None, 30, None)
    mode = RecordingSegmentMode(keys, 0.5, lambda: filler)  # type: ignore[arg-type,return-value]
    mode.saved = []

    def no_runs() -> StoredRunLoader:
        raise AssertionError("no staged run here")

    modes = Modes(PrefixMode(PrefixTransfer(store, "m", "t"), BS), mode, StagedMode(keys, no_runs))
    worker = ConnectorWorker(modes, BS, tmp_path)
    worker.paged = object()  # type: ignore[assignment]  # the fake filler never touches it
    spec = RequestSpec(SPANS, "pic")

    def work(req: str, load: tuple[int, int], save: bool) -> RequestWork:
        return RequestWork(req, "segments", list(range(80)), [7, 8, 9], spec, load, save)

    worker.load([work("r1", (16, 50), False)], [])
    worker.load([work("r1", (50, 79), True)], [])
    worker.save([work("r1", (50, 79), True)])
    worker.load([work("r2", (16, 79), True)], [])  # this fill left every token exact
    worker.save([work("r2", (16, 79), True)])
    worker.load([work("r3", (16, 79), False)], [])
    worker.load([], ["r3"])  # r3 ended (cancelled) before its prefill completed
    worker.load([work("r3", (16, 79), True)], [])  # a request of the same id, exact
    worker.save([work("r3", (16, 79), True)])
    assert mode.saved == [45, None, None]
