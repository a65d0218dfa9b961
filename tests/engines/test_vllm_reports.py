"""The worker's report book stays bounded: names forgotten when requests finish or when too
many are held, and the reports folder pruned to its newest files (no vLLM)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentcache.engines.vllm import reports
from agentcache.engines.vllm.reports import (
    ReportBook,
    ReportError,
    RequestStats,
    read_report,
    write_report,
)


def test_finished_requests_are_forgotten_and_held_names_are_bounded(tmp_path: Path) -> None:
    book = ReportBook(tmp_path, max_requests=3)
    for i in range(5):
        book.remember(f"req{i}", f"name{i}")
    assert len(book) == 3 and book.dropped_names == 2
    book.write("req0", RequestStats(claimed_tokens=1))  # dropped: nothing written for it
    assert not (tmp_path / "reports" / "name0.json").exists()
    book.write("req4", RequestStats(claimed_tokens=2))
    book.write("req4", RequestStats(claimed_tokens=3))
    assert read_report(tmp_path, "name4") == RequestStats(claimed_tokens=5)
    book.forget(["req3", "req4", "unknown"])
    assert len(book) == 1
    book.write("req4", RequestStats(claimed_tokens=7))
    assert not (tmp_path / "reports" / "name4.json").exists()


def test_the_reports_folder_keeps_its_newest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reports, "PRUNE_EVERY", 4)
    book = ReportBook(tmp_path, max_files=3)
    for i in range(8):
        book.remember(f"r{i}", f"n{i}")
        book.write(f"r{i}", RequestStats(claimed_tokens=i))
        os.utime(tmp_path / "reports" / f"n{i}.json", (1000 + i, 1000 + i))
    left = sorted(p.stem for p in (tmp_path / "reports").glob("*.json"))
    assert left == ["n5", "n6", "n7"] and book.pruned_files == 5


def test_request_stats_merge_and_round_trip_through_json() -> None:
    a = RequestStats("segments", claimed_tokens=10, fallback_reasons=("x",), fill_ms=1.5)
    b = RequestStats("staged", reused_tokens=4, misses=(("h", "fixed", 35, "evicted"),))
    merged = a.merge(b)
    assert merged == RequestStats("staged", 10, 4, fallback_reasons=("x",),
                                  misses=(("h", "fixed", 35, "evicted"),), fill_ms=1.5)  # fmt: skip
    body = merged.as_dict()
    assert body["misses"] == [["h", "fixed", 35, "evicted"]] and body["fallback_reasons"] == ["x"]
    assert RequestStats.from_dict(json.loads(json.dumps(body))) == merged
    with pytest.raises(ReportError, match=r"unknown request stats fields \['bogus'\]"):
        RequestStats.from_dict({"bogus": 1})


def test_a_report_is_the_merge_of_its_writes(tmp_path: Path) -> None:
    write_report(tmp_path, "n", RequestStats("prefix", claimed_tokens=3))
    write_report(tmp_path, "n", RequestStats("prefix", stored_entries=2))
    assert read_report(tmp_path, "n", remove=False) == RequestStats("prefix", 3, stored_entries=2)
    assert read_report(tmp_path, "n") is not None and read_report(tmp_path, "n") is None
