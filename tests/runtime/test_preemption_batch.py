"""Preemption in the batched scheduler: a pool that holds two of eight concurrent requests
preempts running turns (their KV swapped to the host or dropped and recomputed) and resumes
them; every greedy output is its solo run's, and the preemptions are counted."""

from __future__ import annotations

import pytest
import torch

from agentcache.errors import ConfigError, UnknownStrategyError
from agentcache.kv.pool import SequenceKV
from agentcache.kv.preemption import Preempted, Recompute, Swap
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.runtime.scheduler import BatchScheduler, Running
from tests.conftest import at_once
from tests.runtime.test_scheduler import prompt

POOL_PAGES = 40  # 16-token pages: two of the longest requests below (about 19 pages each)
NEW = (70, 17, 60, 9, 45, 63, 12, 68)  # max_new_tokens per request
STRATEGIES = ("full", "prefix", "full", "full", "prefix", "full", "full", "prefix")


def request(e: Engine, i: int, strategy: str | None = None) -> Generation:
    params = GenerationParams(max_new_tokens=NEW[i])
    return e.generate(prompt(i), params, strategy or STRATEGIES[i], commit=False)


@pytest.fixture(scope="module")
def solo(tiny: LoadedModel) -> list[Generation]:
    """Each request alone on an engine without batching or preemption (the reference)."""
    ref = Engine(tiny, EngineConfig(kv_pages=256))
    return [request(ref, i) for i in range(len(NEW))]


@pytest.mark.parametrize(
    ("policy", "host_bytes"), [("swap", 1 << 30), ("recompute", 0), ("swap", 0)]
)
def test_eight_requests_on_a_pool_for_two_each_get_their_solo_output(
    tiny: LoadedModel, solo: list[Generation], policy: str, host_bytes: int
) -> None:
    """("swap" with no host memory drops every preempted turn: recomputed on resume.)"""
    config = EngineConfig(kv_pages=POOL_PAGES, batch_decode=True, preemption=policy,
                          preemption_host_bytes=host_bytes)  # fmt: skip
    e = Engine(tiny, config)
    together = at_once(lambda i: request(e, i), len(NEW))
    for i, (t, s) in enumerate(zip(together, solo, strict=True)):
        assert (t.token_ids, t.finish_reason) == (s.token_ids, s.finish_reason), i
    assert e.batch is not None
    stats = e.batch.stats()
    assert stats.preempted > 0 and stats.resumed == stats.preempted
    assert stats.waiting_preempted == 0
    if policy == "swap" and host_bytes:
        assert stats.swapped_bytes > 0 and stats.recomputed_tokens == 0
    else:
        assert stats.swapped_bytes == 0 and stats.recomputed_tokens > 0
    assert e.ctx.pool.num_free == POOL_PAGES  # every page back
    assert e.ctx.pool.peak_pages_used <= POOL_PAGES


def test_without_preemption_the_same_requests_wait_at_admission(
    tiny: LoadedModel, solo: list[Generation]
) -> None:
    """The reference for the counts: the pool the same, no turn is preempted (they queue)."""
    e = Engine(tiny, EngineConfig(kv_pages=POOL_PAGES, batch_decode=True))
    together = at_once(lambda i: request(e, i), len(NEW))
    assert [t.token_ids for t in together] == [s.token_ids for s in solo]
    assert e.batch is not None and e.batch.stats().preempted == 0
    assert e.gate.waited > 0


def test_preemption_settings_are_checked(tiny: LoadedModel) -> None:
    with pytest.raises(ConfigError, match="batch_decode"):
        EngineConfig(preemption="swap")
    with pytest.raises(UnknownStrategyError, match="evict"):
        EngineConfig(batch_decode=True, preemption="evict")
    with pytest.raises(ConfigError, match="preemption_host_bytes"):
        EngineConfig(batch_decode=True, preemption="swap", preemption_host_bytes=-1)


@pytest.mark.parametrize("policy", ["swap", "recompute"])
def test_a_resumed_turn_holds_the_kv_it_held_when_preempted(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """Bit for bit, every layer: swapped back, or recomputed (prompt by its prefill, generated
    tokens replayed through the step each was first fed by)."""
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(seq) -> K/V at preemption
    checked: list[bool] = []

    def snapshot(seq: SequenceKV) -> None:
        held[id(seq)] = seq.gather_all(slice(None))

    class Kept(Swap):
        def preempt(self, seq: SequenceKV) -> Preempted:
            snapshot(seq)
            return super().preempt(seq)

    class Dropped(Recompute):
        def preempt(self, seq: SequenceKV) -> Preempted:
            snapshot(seq)
            return super().preempt(seq)

    resume = BatchScheduler._resume

    def checking(self: BatchScheduler, batch: list[Running]) -> int:
        waiting = [r for r in batch if r.preempted is not None]
        done = resume(self, batch)
        for r in waiting:
            if r.preempted is None:  # resumed
                seq = r.decoder.seq  # type: ignore[attr-defined]
                k, v = seq.gather_all(slice(None))
                hk, hv = held[id(seq)]
                checked.append(torch.equal(k, hk) and torch.equal(v, hv))
        return done

    monkeypatch.setattr(BatchScheduler, "_resume", checking)
    config = EngineConfig(kv_pages=POOL_PAGES, batch_decode=True, preemption=policy)
    e = Engine(tiny, config)
    assert e.batch is not None
    e.batch.preemption = Kept() if policy == "swap" else Dropped()
    at_once(lambda i: request(e, i, "full"), len(NEW))
    assert checked and all(checked)
    assert len(checked) == e.batch.stats().resumed
