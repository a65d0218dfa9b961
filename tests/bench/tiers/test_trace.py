"""Store traces: a replay without the model repeats what a concurrent run did on the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.bench.tiers.bench import _rounds
from agentcache.bench.tiers.trace import CRC_DIGITS_SLACK, REPRODUCED, StoreTrace, recording, replay
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.tiers import TierConfig, TieredSegmentStore
from agentcache.workload.files import Session, Turn
from tests.tiers.conftest import agent_turn
from tests.tiers.test_concurrency import KV_PAGES, SESSIONS, TURNS, WORKING_SET


def tight(root: Path, spill: str) -> TierConfig:
    return TierConfig(fast_bytes=WORKING_SET, host_bytes=WORKING_SET // 2, disk_dir=root,
                      spill=spill, fsync=False)  # fmt: skip


def recorded_run(model: LoadedModel, root: Path, spill: str) -> tuple[StoreTrace, Engine]:
    """SESSIONS sessions on threads, turn by turn (one round per turn, as bench-tiers runs
    them), store recorded."""
    engine = Engine(model, EngineConfig(strategy="rpdc", kv_pages=KV_PAGES,
                                        tiers=tight(root, spill)))  # fmt: skip
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    sessions = [Session(f"s{s}", "tiny", "", tuple(Turn(agent_turn(t, s), 2) for t in range(TURNS)))
                for s in range(SESSIONS)]  # fmt: skip
    with recording(store) as trace:
        _rounds(engine, sessions, SESSIONS, lambda _: None, trace.mark_round)
    return trace, engine


@pytest.mark.parametrize("spill", ["slide", "lru"])
def test_a_replay_repeats_a_concurrent_runs_store_calls_and_disk_writes(
    tiny: LoadedModel, tmp_path: Path, spill: str
) -> None:
    trace, engine = recorded_run(tiny, tmp_path / "run", spill)
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    run = store.counters()
    kinds = {op.kind for op in trace.ops}
    assert kinds == {"lookup", "put", "update"} and len(trace.rounds) == TURNS
    assert any(op.kind == "lookup" and op.result for op in trace.ops)  # reuse happened
    assert store.tier_stats.spills > 0 and run["disk"]["writes"] > 0 and run["disk"]["hits"] > 0

    fresh = TieredSegmentStore(tight(tmp_path / "replay", spill))
    result = replay(trace, fresh, run)
    assert result.mismatches == []
    exact = [k for k in REPRODUCED if k != "bytes_written"]
    for tier in run:
        assert {k: result.counters[tier][k] for k in exact} == {k: run[tier][k] for k in exact}
        slack = CRC_DIGITS_SLACK * run[tier]["writes"] if tier == "disk" else 0
        assert abs(result.counters[tier]["bytes_written"] - run[tier]["bytes_written"]) <= slack
    assert fresh.tier_stats.spills == store.tier_stats.spills
    assert fresh.tier_stats.updates == store.tier_stats.updates > 0
    assert len(result.round_seconds) == TURNS and result.turns_per_s > 0
    summary = result.summary()
    assert summary["matches_run"] and summary["seconds"] == sum(result.round_seconds)


def test_a_replay_that_does_not_repeat_the_run_lists_what_differs(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    # slide's calls replayed under lru: lru writes every victim whole, one call per page
    trace, engine = recorded_run(tiny, tmp_path / "run", "slide")
    store = engine.store
    assert isinstance(store, TieredSegmentStore)
    result = replay(trace, TieredSegmentStore(tight(tmp_path / "lru", "lru")), store.counters())
    assert any(m.startswith("disk.write_calls") for m in result.mismatches)
    assert not result.summary()["matches_run"]


def test_recording_leaves_the_store_as_it_was(tiny: LoadedModel, tmp_path: Path) -> None:
    store = TieredSegmentStore(tight(tmp_path, "slide"))
    with recording(store) as trace:
        assert "lookup_content" in vars(store)
        assert not store.lookup_content("m", "t", "c").hit
    assert not {"lookup_content", "put_content", "update_pages"} & set(vars(store))
    assert [(op.kind, op.result) for op in trace.ops] == [("lookup", False)]


def test_a_trace_without_kv_shapes_or_with_unmarked_ops_is_an_error(tmp_path: Path) -> None:
    store = TieredSegmentStore(tight(tmp_path, "slide"))
    with pytest.raises(ValueError, match="no K/V shapes"):
        replay(StoreTrace(), store)
    with recording(store) as trace:
        store.lookup_content("m", "t", "c")
    trace.layout = (4, 2, 16)
    with pytest.raises(ValueError, match="1 ops after the last round mark"):
        replay(trace, store)
