"""The connector's three transfer modes, one class each, chosen once per request (no vLLM).

    mode      scheduler claims (plan.py)                   worker loads      worker saves
    prefix    stored prefix blocks after vLLM's hit        PrefixTransfer    prefix blocks
    segments  every token up to the last prompt token,     SegmentFiller     every segment
              if stored segments cover enough of it
    staged    the rest of the stage's run of stored KV     StoredRunLoader   every segment
              (stages.py)

`choose_mode` picks a request's mode from its spec; the scheduler sends the mode's name with
each step's work and the worker looks the same mode up by it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from agentcache.engines.vllm.plan import (
    claim_prefix,
    claim_segments,
    claim_stage,
    unclaimed_segments,
)
from agentcache.engines.vllm.reports import MissRow, RequestStats, TokenRun
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.transfer import (
    PagedKV,
    PrefixTransfer,
    SegmentFiller,
    StoredRunLoader,
    save_segments,
    stored_inexact_from,
)
from agentcache.kv.store import SegmentStore
from agentcache.reuse.base import ReuseStats
from agentcache.runtime.stats import TokenReuse

VLLM_FILLS_SEGMENTS = (
    "the connector runs with fill='vllm' and serves segment spans through staged "
    "prefills only (VLLMBackend sends them): vLLM computed the span"
)


@dataclass(frozen=True)
class RequestWork:
    """One request's transfer in one step, as the scheduler sends it to the workers."""

    req_id: str
    mode: str  # `TransferMode.name`
    token_ids: list[int]
    block_ids: list[int]
    spec: RequestSpec
    load: tuple[int, int] | None  # token span to fill this step
    save: bool  # the prompt's prefill completes this step


@dataclass(frozen=True)
class Claim:
    """What the scheduler claims after vLLM's hit, and why it left tokens to vLLM."""

    num_tokens: int
    declined: str | None = None  # why the run or span the request asked for was not claimed
    # segments mode, nothing claimed: the reusable segments vLLM computes, and why
    unclaimed: tuple[list[MissRow], str | None] | None = None


@dataclass(frozen=True)
class Loaded:
    """What a worker's load did: its counters, and the blocks vLLM recomputes."""

    stats: RequestStats
    failed_blocks: frozenset[int] = field(default_factory=frozenset)
    # the first token of the prompt whose K/V is not full recompute's after this load
    # (None: every token's is, as far as this load goes)
    inexact_from: int | None = None


@dataclass(frozen=True)
class StoreKeys:
    """The store and the keys this model's entries live under."""

    store: SegmentStore
    model_id: str
    tokenizer_id: str

    def present(self, cid: str) -> bool:
        return self.store.contains_content(self.model_id, self.tokenizer_id, cid)


class TransferMode(ABC):
    """How the connector serves a request.

    `claim` (scheduler) returns how many tokens after vLLM's hit of `num_computed` the
    connector fills; it reads the store's index and changes nothing. `load` (worker) writes
    the claimed tokens `work.load` into vLLM's pages; a block it cannot fill is returned in
    `Loaded.failed_blocks` (vLLM recomputes it), a fill that fails as a whole raises an
    `AgentCacheError`. `save` (worker) stores what the pages hold of a prompt whose prefill
    is complete, skipping entries already stored, and returns the entries written;
    `inexact_from` is the first token the request's loads left not full recompute's (the
    least `Loaded.inexact_from` of its loads; None: none did).
    """

    name: ClassVar[str]

    @abstractmethod
    def claim(self, spec: RequestSpec, token_ids: Sequence[int], num_computed: int) -> Claim: ...

    @abstractmethod
    def load(self, paged: PagedKV, work: RequestWork) -> Loaded: ...

    @abstractmethod
    def save(self, paged: PagedKV, work: RequestWork, inexact_from: int | None = None) -> int: ...


class PrefixMode(TransferMode):
    name = "prefix"

    def __init__(self, prefix: PrefixTransfer, block_size: int) -> None:
        self.prefix = prefix
        self.block_size = block_size

    def claim(self, spec: RequestSpec, token_ids: Sequence[int], num_computed: int) -> Claim:
        return Claim(claim_prefix(token_ids, self.block_size, num_computed, self.prefix.present))

    def load(self, paged: PagedKV, work: RequestWork) -> Loaded:
        assert work.load is not None
        start, end = work.load
        failed = self.prefix.load(paged, work.token_ids, work.block_ids, start, end)
        reused = end - start - len(failed) * self.block_size
        stats = RequestStats(self.name, reused_tokens=reused, load_failures=len(failed))
        return Loaded(stats, frozenset(failed))

    def save(self, paged: PagedKV, work: RequestWork, inexact_from: int | None = None) -> int:
        return self.prefix.save(paged, work.token_ids, work.block_ids)  # exact blocks only


class _SavesSegments(TransferMode):
    def __init__(self, keys: StoreKeys) -> None:
        self.keys = keys

    def save(self, paged: PagedKV, work: RequestWork, inexact_from: int | None = None) -> int:
        k = self.keys
        return save_segments(
            k.store, k.model_id, k.tokenizer_id, paged, work.spec, work.token_ids, work.block_ids,
            inexact_from,
        )  # fmt: skip


class SegmentMode(_SavesSegments):
    """`filler` (None under fill='vllm': the span is left to vLLM, stored after) loads the
    worker's segment filler, the model's weights on its first call."""

    name = "segments"

    def __init__(
        self,
        keys: StoreKeys,
        min_reused_fraction: float,
        filler: Callable[[], SegmentFiller] | None,
    ) -> None:
        super().__init__(keys)
        self.min_reused_fraction = min_reused_fraction
        self.filler = filler

    def claim(self, spec: RequestSpec, token_ids: Sequence[int], num_computed: int) -> Claim:
        if self.filler is None:  # nothing here computes the span's other tokens
            return Claim(0, declined=VLLM_FILLS_SEGMENTS)
        floor = self.min_reused_fraction if spec.min_reused is None else spec.min_reused
        present = self.keys.present
        n = claim_segments(spec, token_ids, num_computed, present, floor)
        if n > 0:
            return Claim(n)
        # vLLM computes the segments after its own hit: say why
        return Claim(0, unclaimed=unclaimed_segments(spec, token_ids, num_computed, present))

    def load(self, paged: PagedKV, work: RequestWork) -> Loaded:
        assert work.load is not None and self.filler is not None  # claims nothing without it
        start, end = work.load
        filled = self.filler().fill(paged, work.spec, work.token_ids, work.block_ids, start, end)
        rs = filled.stats
        misses = tuple((m.segment_id, str(m.kind), m.num_tokens, str(m.reason)) for m in rs.misses)
        stats = RequestStats(
            self.name, reused_tokens=rs.reused_tokens, computed_tokens=rs.recomputed_tokens,
            fallbacks=rs.fallbacks, fallback_reasons=tuple(rs.fallback_reasons), misses=misses,
            token_runs=span_runs(rs, start, end),
        )  # fmt: skip
        return Loaded(stats, inexact_from=filled.inexact_from)


class StagedMode(_SavesSegments):
    """`runs` gives the worker's stored-run loader (made once vLLM registered its caches)."""

    name = "staged"

    def __init__(self, keys: StoreKeys, runs: Callable[[], StoredRunLoader]) -> None:
        super().__init__(keys)
        self.runs = runs

    def claim(self, spec: RequestSpec, token_ids: Sequence[int], num_computed: int) -> Claim:
        n, declined = claim_stage(spec, token_ids, num_computed, self.keys.present)
        return Claim(n, declined=declined)

    def load(self, paged: PagedKV, work: RequestWork) -> Loaded:
        assert work.load is not None
        start, end = work.load
        run = self.runs().fill(paged, work.spec, work.token_ids, work.block_ids, start, end)
        stats = RequestStats(
            self.name, reused_tokens=run.reused_tokens, load_failures=len(run.failed_blocks),
            misses=tuple(run.misses),
        )  # fmt: skip
        return Loaded(stats, frozenset(run.failed_blocks))

    def save(self, paged: PagedKV, work: RequestWork, inexact_from: int | None = None) -> int:
        # the earlier stages' runs came through vLLM's prefix cache: what they loaded is read
        # back from the store (the copies a run loads)
        k = self.keys
        stored = stored_inexact_from(k.store, k.model_id, k.tokenizer_id, work.spec, work.token_ids)
        bounds = [b for b in (inexact_from, stored) if b is not None]
        return super().save(paged, work, min(bounds) if bounds else None)


@dataclass(frozen=True)
class Modes:
    """The connector's modes; `segments` False serves every request in prefix mode."""

    prefix: PrefixMode
    segment: SegmentMode
    staged: StagedMode
    segments: bool = True

    def choose(self, spec: RequestSpec) -> TransferMode:
        if not self.segments or not spec.spans:
            return self.prefix
        return self.segment if spec.stage is None else self.staged

    def named(self, name: str) -> TransferMode:
        for mode in (self.prefix, self.segment, self.staged):
            if mode.name == name:
                return mode
        raise ValueError(f"unknown transfer mode {name!r}")


def span_runs(stats: ReuseStats, start: int, end: int) -> tuple[TokenRun, ...]:
    """Where the KV of the filled span [start, end) came from, from the strategy's masks over
    the whole prompt (`TokenReuse`); empty for a strategy that keeps no masks."""
    if stats.reused is None and stats.reused_tokens > 0:
        return ()
    uses = TokenReuse.of(stats.prompt_tokens, stats.reused, stats.exact, stats.dirty)
    out = []
    for s, e, use in uses.runs:
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            out.append((lo, hi, use.value))
    return tuple(out)
