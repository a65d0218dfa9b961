"""Preemption under a full pool: eight requests on a pool that holds two sequences, each
preempted (swapped to the host or dropped and recomputed) and resumed until it is done; at
the end every request's K/V is exactly what it computed, token by token.

The K/V of token t of request r is a function of (r, t) alone, as a causal model's is of
the tokens up to t: recomputing it gives the same values, so a resumed sequence can be
checked against what it would hold had it never been preempted."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
import torch

from agentcache.errors import OutOfPagesError
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.kv.preemption import PREEMPTION_POLICIES, Preempted, PreemptionPolicy, Swap
from agentcache.kv.swap import swap_in, swap_out

L, HKV, DH, PAGE = 2, 2, 4, 4
PROMPT, NEW = 10, 14  # 24 tokens: 6 pages a finished request
POOL_PAGES = 12  # two finished requests at once


def kv_of(request: int, tokens: range) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, n, Hkv, Dh) K/V of tokens `tokens` of `request`."""
    g = torch.Generator().manual_seed(request)
    keys = torch.randn((L, PROMPT + NEW, HKV, DH), generator=g)
    values = torch.randn((L, PROMPT + NEW, HKV, DH), generator=g)
    return keys[:, tokens.start : tokens.stop], values[:, tokens.start : tokens.stop]


def compute(seq: SequenceKV, request: int, start: int, end: int) -> None:
    """Prefill or decode tokens [start, end) of `request` into `seq`."""
    slots = seq.extend(end - start)
    seq.write_all(slots, *kv_of(request, range(start, end)))


@dataclass
class Request:
    id: int
    seq: SequenceKV
    preempted: Preempted | None = None
    done: bool = False
    times_preempted: int = 0
    history: list[str] = field(default_factory=list)


def run(policy: PreemptionPolicy) -> tuple[list[Request], PagePool]:
    """A minimal scheduler: admit in order while pages allow, one token per running request
    per step; a request that cannot get its next page preempts the newest running one."""
    pool = PagePool(PoolConfig(L, HKV, DH, num_pages=POOL_PAGES, page_size=PAGE))
    requests = [Request(i, SequenceKV(pool)) for i in range(8)]
    waiting, running = deque(requests), []
    for _ in range(10_000):
        if not waiting and not running:
            break
        while waiting:  # admit (or resume) the oldest waiting request
            r = waiting[0]
            try:
                if r.preempted is None:
                    compute(r.seq, r.id, 0, PROMPT)
                else:
                    restored = policy.resume(r.seq, r.preempted)
                    compute(r.seq, r.id, restored, r.preempted.num_tokens)
                    r.preempted = None
            except OutOfPagesError:
                r.seq.free()  # a partial prefill leaves nothing behind
                break
            running.append(waiting.popleft())
        for r in list(running):
            if r not in running:
                continue
            n = r.seq.num_tokens
            while True:
                try:
                    compute(r.seq, r.id, n, n + 1)
                    break
                except OutOfPagesError:
                    victim = running[-1]  # the newest admitted
                    victim.preempted = policy.preempt(victim.seq)
                    victim.times_preempted += 1
                    running.remove(victim)
                    waiting.appendleft(victim)
                    if victim is r:
                        break
            if r in running and r.seq.num_tokens == PROMPT + NEW:
                expect_k, expect_v = kv_of(r.id, range(PROMPT + NEW))
                keys, values = r.seq.gather_all(slice(None))
                assert torch.equal(keys, expect_k) and torch.equal(values, expect_v), r.id
                r.done = True
                r.seq.free()
                running.remove(r)
    return requests, pool


@pytest.mark.parametrize("name", PREEMPTION_POLICIES.names())
def test_eight_requests_on_a_pool_of_two_finish_with_their_own_kv(name: str) -> None:
    policy = PREEMPTION_POLICIES.get(name)()
    requests, pool = run(policy)
    assert all(r.done for r in requests)
    assert policy.counters.preempted >= 4  # the pool was short, more than once
    assert sum(r.times_preempted > 0 for r in requests) >= 2
    assert pool.num_free == POOL_PAGES  # every page came back
    if name == "swap":
        assert policy.counters.swapped_bytes > 0 and policy.counters.recomputed_tokens == 0
        assert isinstance(policy, Swap) and policy.held_bytes == 0
    else:
        assert policy.counters.recomputed_tokens > 0


def test_a_swap_over_the_host_budget_drops_and_counts_the_fallback() -> None:
    policy = Swap(host_bytes=1)
    requests, _ = run(policy)
    assert all(r.done for r in requests)
    assert policy.counters.fallbacks == policy.counters.preempted > 0
    assert policy.counters.swapped_bytes == 0


def test_swap_round_trip_is_bit_exact_and_refuses_without_room() -> None:
    pool = PagePool(PoolConfig(L, HKV, DH, num_pages=4, page_size=PAGE))
    seq = SequenceKV(pool)
    compute(seq, 3, 0, 13)
    kept = swap_out(seq)
    assert seq.num_tokens == 0 and pool.num_free == 4
    other = SequenceKV(pool)
    other.extend(4)  # one page taken: 3 free, 13 tokens need 4
    with pytest.raises(OutOfPagesError, match="needs 4 KV pages, only 3"):
        swap_in(seq, kept)
    assert pool.num_free == 3  # nothing taken
    other.free()
    swap_in(seq, kept)
    keys, values = seq.gather_all(slice(None))
    expect = kv_of(3, range(13))
    assert torch.equal(keys, expect[0]) and torch.equal(values, expect[1])
    with pytest.raises(ValueError, match="empty sequence"):
        swap_in(seq, kept)
