"""What happens to a running sequence's KV when the pool is full and it is preempted: kept
on the host (`swap`) or dropped and recomputed (`recompute`).

The scheduler chooses the victim (the newest admitted sequence first, as vLLM does, so the
oldest turns finish) and calls `preempt`; when pages are free again it calls `resume` on an
empty sequence and recomputes tokens [restored, num_tokens) itself, by prefill, exactly as
it computed them the first time. A sequence is never corrupted: its tokens are either read
back bit for bit or computed again from their ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from agentcache.kv.pool import SequenceKV
from agentcache.kv.swap import SwappedKV, swap_in, swap_out
from agentcache.registry import Registry

PREEMPTION_POLICIES: Registry[PreemptionPolicy] = Registry("preemption policy")


@dataclass(frozen=True)
class Preempted:
    """A preempted sequence's KV: `num_tokens` it held, and the host copy (None: dropped)."""

    num_tokens: int
    kept: SwappedKV | None


@dataclass
class PreemptionCounters:
    preempted: int = 0  # sequences preempted
    swapped_bytes: int = 0  # K/V bytes copied to the host (out; the same come back in)
    recomputed_tokens: int = 0  # tokens resumed without a host copy
    fallbacks: int = 0  # swaps that found the host budget full and dropped instead


class PreemptionPolicy(ABC):
    """Contract: `preempt(seq)` frees every page of `seq` (it is empty after) and returns
    what `resume` needs; `resume(seq, p)` takes an empty `seq` and returns `restored`, the
    tokens [0, restored) whose K/V it wrote back, bit for bit; the caller recomputes
    [restored, p.num_tokens). `resume` raises OutOfPagesError, taking nothing, when the
    pool cannot hold the restored tokens; the caller retries later with the same `p`."""

    def __init__(self) -> None:
        self.counters = PreemptionCounters()

    @abstractmethod
    def preempt(self, seq: SequenceKV) -> Preempted: ...

    @abstractmethod
    def resume(self, seq: SequenceKV, preempted: Preempted) -> int: ...

    def discard(self, preempted: Preempted) -> None:
        """Let go of what `preempt` kept for a sequence that will not be resumed."""
        return None


@PREEMPTION_POLICIES.register("recompute")
class Recompute(PreemptionPolicy):
    """Drop the pages; the whole sequence is recomputed on resume (no host memory)."""

    def preempt(self, seq: SequenceKV) -> Preempted:
        n = seq.num_tokens
        seq.free()
        self.counters.preempted += 1
        return Preempted(n, None)

    def resume(self, seq: SequenceKV, preempted: Preempted) -> int:
        self.counters.recomputed_tokens += preempted.num_tokens
        return 0


@PREEMPTION_POLICIES.register("swap")
class Swap(PreemptionPolicy):
    """Copy the K/V to host memory, at most `host_bytes` held at once; a preemption that
    would exceed it drops the sequence instead (counted in `fallbacks`)."""

    def __init__(self, host_bytes: int = 1 << 30) -> None:
        super().__init__()
        if host_bytes < 0:
            raise ValueError(f"host_bytes must be >= 0, got {host_bytes}")
        self.host_bytes = host_bytes
        self.held_bytes = 0  # host bytes of the sequences swapped out now

    def preempt(self, seq: SequenceKV) -> Preempted:
        n = seq.num_tokens
        c = seq.pool.config
        need = n * (c.page_bytes // c.page_size)  # what swap_out's copies hold
        self.counters.preempted += 1
        if self.held_bytes + need > self.host_bytes:
            self.counters.fallbacks += 1
            seq.free()
            return Preempted(n, None)
        kept = swap_out(seq)
        self.held_bytes += kept.nbytes
        self.counters.swapped_bytes += kept.nbytes
        return Preempted(n, kept)

    def discard(self, preempted: Preempted) -> None:
        if preempted.kept is not None:
            self.held_bytes -= preempted.kept.nbytes

    def resume(self, seq: SequenceKV, preempted: Preempted) -> int:
        if preempted.kept is None:
            self.counters.recomputed_tokens += preempted.num_tokens
            return 0
        swap_in(seq, preempted.kept)
        self.held_bytes -= preempted.kept.nbytes
        return preempted.num_tokens
