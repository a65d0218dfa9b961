"""Preemption in the batched scheduler: a pool that holds two of eight concurrent requests
preempts running turns (their KV swapped to the host or dropped and recomputed) and resumes
them; every greedy output is its solo run's, and the preemptions are counted."""

from __future__ import annotations

import threading

import pytest
import torch

from agentcache.errors import ConfigError, ContextLengthError, UnknownStrategyError
from agentcache.kv.pool import SequenceKV
from agentcache.kv.preemption import Preempted, Recompute, Swap
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import (
    Engine,
    EngineConfig,
    Generation,
    GenerationParams,
    PoolCapacityError,
)
from agentcache.runtime.scheduler import BatchScheduler, Running
from tests.conftest import at_once
from tests.runtime.test_scheduler import prompt as long_prompt

# short prompts, long replies: eight fit the pool at admission, then outgrow it as they decode
POOL_PAGES = 32  # 16-token pages: two of the longest requests below (about 15 pages each)
NEW = (200, 60, 170, 30, 120, 190, 45, 180)  # max_new_tokens per request


def prompt(i: int) -> SegmentedPrompt:
    """Request i's prompt: a few dozen tokens, its length growing with i."""
    return SegmentedPrompt([Segment(SegmentKind.UPDATE, f"task {i}: count" + " up" * i, "u",
                                    "user")])  # fmt: skip


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


@pytest.mark.parametrize("policy", ["swap", "recompute"])
def test_a_request_that_can_never_fit_the_pool_fails_before_it_queues(
    tiny: LoadedModel, policy: str
) -> None:
    """Under preemption: named with its size and the pool's, as a context-length error (a 400
    on the server); no page taken, nothing admitted; one that fits runs. (Without
    preemption it runs alone and stops where the pool ends: tests/runtime/test_engine.py.)"""
    config = EngineConfig(kv_pages=12, batch_decode=True, preemption=policy)  # 192 tokens
    e = Engine(tiny, config)
    tokens = e.tokenize(long_prompt(0))  # 140 tokens
    with pytest.raises(PoolCapacityError, match=r"prompt \(140\) \+ max_new_tokens \(60\) is "
                       r"200 tokens but the engine's KV pool \(12 pages of 16 tokens, \d+ bytes\) "
                       r"holds 192 tokens") as err:  # fmt: skip
        e.generate(tokens, GenerationParams(max_new_tokens=60), "full", commit=False)
    assert isinstance(err.value, ContextLengthError)
    assert e.ctx.pool.num_free == 12 and e.ctx.pool.peak_pages_used == 0
    assert e.gate.running == 0 and e.gate.waited == 0
    fits = e.generate(tokens, GenerationParams(max_new_tokens=52), "full", commit=False)
    assert len(fits.token_ids) <= 52


def test_a_turn_cancelled_mid_batch_gives_its_pages_back_while_the_others_run(
    tiny: LoadedModel,
) -> None:
    """Counted in free pages: once the cancelled turn's thread is out, the pool holds only
    the running turn's pages, before that turn's next token."""
    e = Engine(tiny, EngineConfig(kv_pages=256, batch_decode=True))
    gone = threading.Event()
    free_after: list[int] = []

    class Gone(Exception):
        pass

    def cancel_at_third(token: int, seen: list[int] = []) -> None:  # noqa: B006
        seen.append(token)
        if len(seen) == 3:
            raise Gone

    def long_turn(token: int, seen: list[int] = []) -> None:  # noqa: B006
        seen.append(token)
        if gone.is_set() and not free_after:
            free_after.append(e.ctx.pool.num_free)
            running = e.ctx.pool.num_used
            free_after.append(running)

    def work(i: int) -> str:
        if i == 0:
            with pytest.raises(Gone):
                params = GenerationParams(max_new_tokens=30)
                e.generate(long_prompt(1), params, "full", commit=False, on_token=cancel_at_third)
            gone.set()
            return "cancelled"
        e.generate(long_prompt(7), GenerationParams(max_new_tokens=60), "full", commit=False,
                   on_token=long_turn)  # fmt: skip
        return "done"

    assert at_once(work, 2) == ["cancelled", "done"]
    assert free_after, "the long turn ended before the cancel"
    free, used = free_after
    long_pages = -(-(e.tokenize(long_prompt(7)).num_tokens + 60 + 16) // 16)  # its reservation
    assert used == long_pages and free == 256 - long_pages
    assert e.ctx.pool.num_free == 256


def test_a_lone_turn_short_of_pages_held_outside_the_step_waits_for_them(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages held by a sequence outside the batch (a turn between its prefill and its first
    step, or one leaving) leave a lone turn short: it is preempted and resumes once they come
    back, with its solo output, instead of failing."""
    params = GenerationParams(max_new_tokens=60)
    solo = Engine(tiny, EngineConfig(kv_pages=64)).generate(prompt(3), params, "full",
                                                            commit=False)  # fmt: skip
    e = Engine(tiny, EngineConfig(kv_pages=12, batch_decode=True, preemption="recompute"))
    assert e.batch is not None
    prompt_pages = -(-(e.tokenize(prompt(3)).num_tokens + 1) // 16)
    reply_pages = -(-(e.tokenize(prompt(3)).num_tokens + len(solo.token_ids)) // 16)
    outside = SequenceKV(e.ctx.pool)
    with e._lock:  # the turn's prompt fits beside them, its reply does not
        outside.reserve(12 - prompt_pages)
    assert reply_pages > prompt_pages
    preempted = threading.Event()
    preempt = BatchScheduler._preempt

    def noting(self: BatchScheduler, r: Running) -> None:
        preempt(self, r)
        preempted.set()

    monkeypatch.setattr(BatchScheduler, "_preempt", noting)

    def give_back() -> None:
        preempted.wait(30)
        with e._lock:
            outside.free()

    holder = threading.Thread(target=give_back)
    holder.start()
    got = e.generate(prompt(3), params, "full", commit=False)
    holder.join()
    assert preempted.is_set() and e.batch.stats().resumed >= 1
    assert got.token_ids == solo.token_ids and got.finish_reason == solo.finish_reason
    assert e.ctx.pool.num_free == 12
