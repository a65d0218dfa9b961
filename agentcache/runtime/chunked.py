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

Fusable plans (`ChunkedPrefill.fusable`: the computed tokens are the prompt's last ones, in
order; `full`'s, `prefix`'s) run each chunk as rows of `batch_step.fused_step`: inside a
scheduler step's decode batch, or alone (`run_chunk`), the same bits either way. Other plans'
chunks run through `compute_subset`, on their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentcache.decode.dense import reads_in_place
from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    PlannedPrefill,
    PrefillResult,
    ReuseContext,
    ReuseStrategy,
    compute_subset,
)
from agentcache.runtime.batch_step import ChunkRows, fused_step

NO_SLOTS = torch.zeros(0, dtype=torch.int64)  # a fused step without decode rows


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

    @property
    def fusable(self) -> bool:
        """Whether its chunks run as rows of a fused step (`batch_step.fused_step`), beside
        a scheduler step's decode rows or alone: the plan computes the prompt's last tokens
        [a, T) in order, so each chunk computes a run [a', b') causally over tokens [0, b'),
        loaded or written by the chunks before it, and the forward's attention is the plain
        one (`decode.dense.reads_in_place`). `full`'s and `prefix`'s plans are; a selective
        plan computing tokens scattered between loaded ones is not: its chunks run through
        `compute_subset`, on their own."""
        c, n = self.computed, self.seq.num_tokens
        tail = len(c) > 0 and int(c[-1]) == n - 1 and int(c[0]) == n - len(c)
        return tail and reads_in_place(self.ctx.model.forward)

    def next_rows(self) -> ChunkRows:
        """The next chunk as rows of a fused step; `take_fused` accounts for it once run."""
        idx = self.computed[self.done : self.done + self.chunk]
        ids = self.prompt.ids
        return ChunkRows(self.seq, torch.tensor([ids[i] for i in idx.tolist()]), idx)

    def run_chunk(self) -> PrefillResult | None:
        """Compute the next chunk on its own; the prefill's result after the last, else None.
        A fusable plan's chunk runs as the fused step's rows with nothing beside them: the
        bits it gets beside any decode rows (`fused_step`), so a prefill's K/V does not
        depend on which of its chunks a step fused, and a preempted turn's prompt recomputed
        (`run_all`) is the same bits. Other plans' chunks run through `compute_subset`."""
        if self.fusable:
            rows = self.next_rows()
            t0 = time.perf_counter()
            _, last = fused_step(self.ctx.model.forward, [], NO_SLOTS, [], [], [rows])
            return self.take_fused(last[0], time.perf_counter() - t0)
        t0 = time.perf_counter()
        idx = self.computed[self.done : self.done + self.chunk]
        s = self.planned.stats
        logits = compute_subset(self.ctx, self.prompt, self.seq, idx, s)
        return self._ran(len(idx), logits, time.perf_counter() - t0)

    def take_fused(self, logits: Tensor, seconds: float) -> PrefillResult | None:
        """Account for the chunk `next_rows` gave, run as rows of a fused step of `seconds`
        (beside decode rows or alone) whose `logits` are after its last token: the work
        `compute_subset` counts for it (its model calls: one embed, a projection and an
        attention per layer, one logits), the step's time as its compute time (shared with
        the rows beside it). The prefill's result after the last chunk, else None."""
        n = self.next_size
        s = self.planned.stats
        layers = self.ctx.model.config.num_layers
        s.recomputed_tokens += n
        s.token_layers_computed += n * layers
        s.model_calls += 2 + 2 * layers
        s.compute_s += seconds
        return self._ran(n, logits, seconds)

    def _ran(self, n: int, logits: Tensor, seconds: float) -> PrefillResult | None:
        t0 = time.perf_counter()
        self.done += n
        if self.done < len(self.computed):
            self.busy_s += seconds
            return None
        result = self.planned.finish(logits)
        self.busy_s += seconds + time.perf_counter() - t0
        # its overhead: the time planning and in chunks not spent computing, not steps waited
        s = self.planned.stats
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
