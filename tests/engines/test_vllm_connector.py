"""The connector's worker side without a running engine (marker `vllm`: imports vLLM's
connector base): a fill that fails is a counted fallback whose blocks vLLM recomputes, and
the report book forgets requests vLLM says are finished."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentcache.engines.vllm.reports import ReportBook, read_report
from agentcache.engines.vllm.request import RequestSpec, SegmentSpan
from agentcache.errors import ContextLengthError
from agentcache.prompt.segments import SegmentKind

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")  # the vllm extra's venv only

from agentcache.engines.vllm import connector  # noqa: E402


class FailingFiller:
    def fill(self, *args: Any) -> None:
        raise ContextLengthError(5000, 4096)


def _connector(folder: Path) -> Any:
    conn = object.__new__(connector.AgentCacheConnector)  # the worker's state, no engine
    conn.block_size = 32
    conn._paged = object()  # the failing filler never touches it
    conn._filler, conn._runs = FailingFiller(), None
    conn._step_stats, conn._failed_blocks = {}, set()
    conn._reports = ReportBook(folder)
    return conn


def test_a_failed_fill_is_a_counted_fallback_and_vllm_recomputes_its_blocks(
    tmp_path: Path,
) -> None:
    conn = _connector(tmp_path)
    spans = (SegmentSpan(SegmentKind.SYSTEM, 0, 40, "s"), SegmentSpan(SegmentKind.FIXED, 40, 80))
    spec = RequestSpec(spans, "pic", report="rep1")
    work = connector.RequestWork("r1", list(range(80)), [7, 8, 9, 4], spec, (16, 79), False)
    conn._connector_metadata = connector.AgentCacheMetadata([work])
    conn.start_load_kv(None)
    assert conn.get_block_ids_with_load_errors() == {7, 8, 9}  # tokens 16..78: blocks 0-2
    conn.build_connector_worker_meta()
    report = read_report(tmp_path, "rep1")
    assert report["fallbacks"] == 1 and report["claimed_tokens"] == 63
    assert (
        "fill failed" in report["fallback_reasons"][0] and "4096" in report["fallback_reasons"][0]
    )
    conn._connector_metadata = connector.AgentCacheMetadata(finished=["r1"])
    conn.start_load_kv(None)
    assert len(conn._reports) == 0
