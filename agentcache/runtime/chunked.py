"""Chunked prefill: a prefill whose computed tokens are known before any layer runs, run a few
tokens at a time, so the batched scheduler (`runtime/scheduler.py`) can advance every decoding
turn between its chunks instead of stalling them for the whole prefill.

    prompt     [0 ................................................... T)
    loaded     [#####]                   read from the store (none for `full`'s plan)
    computed         [ chunk 0 ][ chunk 1 ][ chunk 2 ] ... [ last ]   `chunk` tokens each
    chunk k    through every layer at its natural positions, attending over the sequence's
               K/V before it (loaded, or written by chunks < k), read in place
               (`reuse.base.compute_subset`); the last chunk holds the last token: its logits
               are the first token's

A chunk computes what the whole prefill computes for its tokens, to fp32 rounding (its rows
of each layer's matmuls are summed beside other rows than in one pass): the prompt's K/V and
the first-token logits agree with the whole prefill's to that (`tests/runtime/test_chunked.py`).
The chunks are fixed by the prompt and `chunk` alone, so a turn's bits do not depend on what
else a step runs, and a preempted turn's prompt recomputed through `run_all` is the same bits.

Which plans: those a strategy hands over before any layer runs (`ReuseStrategy.plan_prefill`:
lookup, load, guard done; the computed tokens known, at their natural positions): `full`'s,
exact prefix reuse's (`prefix`), and the selective strategies' whose computed tokens are known
up front at their own indices (`SelectiveRecompute`'s `compute_subset` branch: no ranking pass,
or the probe's shortcut). After the last chunk the plan finishes exactly as the whole prefill
does (`PlannedPrefill.finish`: the strategy's stats, the exact K/V it leaves for `commit`).
Other plans run whole, as one unit, as `prefill` runs them: the approximate plans that need
their probe or check pass (its evidence is read over every computed token at once), moved
positions, a decoupled load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    PlannedPrefill,
    PrefillResult,
    ReuseContext,
    ReuseStrategy,
    compute_subset,
)


@dataclass(eq=False)
class ChunkedPrefill:
    """One prefill's planned computed tokens (`planned.computed`: sorted, the last token last),
    run `chunk` at a time into `seq` (already extended to the prompt, loaded tokens written).
    Not thread-safe: its owner (the scheduler's step, under the engine's lock) runs it."""

    ctx: ReuseContext
    prompt: TokenizedPrompt
    seq: SequenceKV
    planned: PlannedPrefill
    chunk: int
    done: int = 0  # computed tokens run so far
    # time inside `run_chunk`, and before it the planning (lookup, load, guard)
    busy_s: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 token, got {self.chunk}")

    @property
    def computed(self) -> Tensor:
        return self.planned.computed

    @property
    def num_chunks(self) -> int:
        return -(-len(self.computed) // self.chunk)

    @property
    def next_size(self) -> int:
        """Tokens the next chunk computes (0: done)."""
        return min(self.chunk, len(self.computed) - self.done)

    def run_chunk(self) -> PrefillResult | None:
        """Compute the next chunk; the prefill's result after the last, else None."""
        t0 = time.perf_counter()
        idx = self.computed[self.done : self.done + self.chunk]
        s = self.planned.stats
        logits = compute_subset(self.ctx, self.prompt, self.seq, idx, s)
        self.done += len(idx)
        if self.done < len(self.computed):
            self.busy_s += time.perf_counter() - t0
            return None
        result = self.planned.finish(logits)
        self.busy_s += time.perf_counter() - t0
        # its overhead: the time planning and in chunks not spent computing, not steps waited
        s.overhead_s = max(0.0, self.busy_s - s.compute_s)
        return result

    def run_all(self) -> PrefillResult:
        """Every chunk left, one after another (a preempted turn's prompt, recomputed)."""
        while (result := self.run_chunk()) is None:
            pass
        return result


def plan(
    strategy: ReuseStrategy, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV,
    chunk: int,
) -> ChunkedPrefill | PrefillResult:  # fmt: skip
    """`strategy`'s prefill of `prompt` into the empty `seq`: chunks of `chunk` tokens to run,
    when it hands its plan over (`ReuseStrategy.plan_prefill`) and the plan computes more than
    one chunk; else the prefill's result, run whole here (a plan within one chunk in one pass,
    a plan not handed over as `prefill` runs it)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 token, got {chunk}")
    planned = strategy.plan_prefill(ctx, prompt, seq)
    if not isinstance(planned, PlannedPrefill):
        return planned
    if len(planned.computed) <= chunk:
        return planned.run(ctx, prompt, seq)
    busy = time.perf_counter() - planned.stats.started
    return ChunkedPrefill(ctx, prompt, seq, planned, chunk, busy_s=busy)
