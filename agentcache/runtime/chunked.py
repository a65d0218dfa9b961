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

Which plans: `full`'s (every token computed, nothing read from the store; `plan`). Exact prefix
reuse (`prefix`) and the selective strategies' plans whose computed tokens are known up front
at natural positions (the `compute_subset` branch of `SelectiveRecompute`) fit this executor
too once `ReuseStrategy` hands its plan over (lookup, load, guard, then the computed tokens)
rather than running it; until then they run whole, as one unit, and so do the approximate
plans that need their probe or check pass (its evidence is read over every computed token at
once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    PrefillResult,
    ReuseContext,
    ReuseStats,
    ReuseStrategy,
    compute_subset,
)
from agentcache.reuse.full import FullRecompute


@dataclass(eq=False)
class ChunkedPrefill:
    """One prefill's computed tokens `computed` (sorted, the last token last), run `chunk` at a
    time into `seq` (already extended to the prompt, loaded tokens written). Not thread-safe:
    its owner (the scheduler's step, under the engine's lock) runs it."""

    ctx: ReuseContext
    prompt: TokenizedPrompt
    seq: SequenceKV
    computed: Tensor
    positions: Tensor  # (T,) the positions the prompt is encoded at
    chunk: int
    stats: ReuseStats
    done: int = 0  # computed tokens run so far
    busy_s: float = field(default=0.0, repr=False)  # time inside `run_chunk`

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 token, got {self.chunk}")

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
        logits = compute_subset(self.ctx, self.prompt, self.seq, idx, self.stats)
        self.done += len(idx)
        self.busy_s += time.perf_counter() - t0
        if self.done < len(self.computed):
            return None
        s = self.stats
        s.close()  # its overhead: the time in chunks not spent computing, not steps waited
        s.overhead_s = max(0.0, self.busy_s - s.compute_s)
        return PrefillResult(logits, self.positions, s)

    def run_all(self) -> PrefillResult:
        """Every chunk left, one after another (a preempted turn's prompt, recomputed)."""
        while (result := self.run_chunk()) is None:
            pass
        return result


def plan(
    strategy: ReuseStrategy, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV,
    chunk: int,
) -> ChunkedPrefill | None:  # fmt: skip
    """`strategy`'s prefill of `prompt` into the empty `seq` as chunks of `chunk` tokens, when
    its plan is one the runtime can run in chunks (`full`'s) and computes more than one chunk;
    None: it runs whole (nothing taken or written)."""
    n = prompt.num_tokens
    if type(strategy) is not FullRecompute or n <= chunk:
        return None
    stats = ReuseStats(n, ctx.model.config.num_layers)
    seq.extend(n)
    natural = torch.arange(n)
    return ChunkedPrefill(ctx, prompt, seq, natural, natural, chunk, stats)
