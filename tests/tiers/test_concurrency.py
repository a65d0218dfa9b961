"""8 sessions on threads share one engine and a tiered store whose fast tier forces spills:
their outputs equal the same sessions' with an unbounded fast tier."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.tiers import TierCapacityError, TierConfig, TieredSegmentStore
from tests.tiers.conftest import agent_turn

SESSIONS, TURNS, KV_PAGES = 8, 3, 64
TOKEN_BYTES = 4 * 2 * 16 * 2 * 4  # tiny model: 4 layers, 2 KV heads, dim 16, K and V, fp32
WORKING_SET = KV_PAGES * 16 * TOKEN_BYTES


def run_sessions(engine: Engine) -> dict[int, list[tuple[int, ...]]]:
    out: dict[int, list[tuple[int, ...]]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(SESSIONS)

    def session(s: int) -> None:
        try:
            barrier.wait()
            params = GenerationParams(max_new_tokens=4)
            out[s] = [engine.generate(agent_turn(t, s), params).token_ids for t in range(TURNS)]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=session, args=(s,)) for s in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def engine(model: LoadedModel, tiers: TierConfig) -> Engine:
    return Engine(model, EngineConfig(strategy="rpdc", kv_pages=KV_PAGES, tiers=tiers))


@pytest.mark.parametrize(
    ("spill", "deltas"), [("slide", True), ("slide", False), ("lru", False)],
    ids=["slide", "slide-whole", "lru"],
)  # fmt: skip
def test_concurrent_sessions_under_spill_match_unbounded(
    tiny: LoadedModel, tmp_path: Path, spill: str, deltas: bool
) -> None:
    unbounded = run_sessions(engine(tiny, TierConfig(fast_bytes=1 << 30)))
    options = {"deltas": False} if spill == "slide" and not deltas else {}
    tight = TierConfig(
        fast_bytes=WORKING_SET, host_bytes=WORKING_SET // 2, disk_dir=tmp_path, spill=spill,
        fsync=False, spill_options=options,
    )  # fmt: skip
    bounded_engine = engine(tiny, tight)
    bounded = run_sessions(bounded_engine)
    assert bounded == unbounded
    store = bounded_engine.store
    assert isinstance(store, TieredSegmentStore)
    c = store.counters()
    assert store.tier_stats.spills > 0 and c["disk"]["writes"] > 0 and c["disk"]["hits"] > 0
    assert store.stats.evictions == 0 and store.tier_stats.failed_spills == 0
    # dirty pages with a stale disk copy went down as deltas, and were served back exactly
    assert (c["disk"]["delta_writes"] > 0) == deltas


def test_fast_tier_below_one_working_set_fails_at_start(tiny: LoadedModel) -> None:
    with pytest.raises(TierCapacityError, match="working set"):
        engine(tiny, TierConfig(fast_bytes=WORKING_SET - 1))
