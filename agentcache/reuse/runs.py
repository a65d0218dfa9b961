"""Reused runs: where each hit sits in the prompt, whether its KV is exact there, and which
hits form one span (stored together, after the same context, and adjacent again).

    prompt : [ system ][ update ][ fixed A ][ fixed B ][ update ][last]
    runs   :  exact              A          B joins A (one span for offset order)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from agentcache.kv.store import chain_id, computed_after
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.segments import context_ids


@dataclass(frozen=True)
class ReusedRun:
    """A hit as the up-front selection sees it (no KV needed): where it sits, whether its KV is
    exact here, and whether it continues the hit before it (stored right after it, from one
    prompt: the two form one span for `chunks=span`)."""

    start: int
    num_tokens: int
    exact: bool = False
    joins_previous: bool = False

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


class StoredHit(Protocol):
    """What `reused_runs` reads of a hit: `SegmentHit`, or a plan made from store metadata."""

    @property
    def segment(self) -> TokenizedSegment: ...
    @property
    def start(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def stored_context(self) -> str | None: ...
    @property
    def stored_positions(self) -> Tensor | None: ...


@dataclass(frozen=True)
class PlannedHit:
    """A stored segment as a plan sees it, from its metadata and without its KV (a `StoredHit`
    for plans made before any load: the planner's, vLLM's staged prefill)."""

    segment: TokenizedSegment
    num_tokens: int
    stored_context: str | None
    stored_positions: Tensor | None

    @property
    def start(self) -> int:
        return self.segment.start


class ExactPrefixOption(Protocol):
    @property
    def exact_prefix(self) -> bool: ...


def reused_runs(
    prompt: TokenizedPrompt, hits: Sequence[StoredHit], positions: Tensor, o: ExactPrefixOption
) -> list[ReusedRun]:
    """Each hit's run: exact when `o.exact_prefix` and it was stored after this very context
    at these very positions."""
    contexts = dict(zip((s.start for s in prompt.segments), context_ids(prompt), strict=True))
    runs: list[ReusedRun] = []
    prev: StoredHit | None = None
    for h in hits:
        old, new = h.stored_positions, positions[h.start : h.start + h.num_tokens]
        exact = (
            o.exact_prefix
            and old is not None
            and h.stored_context == contexts[h.start]
            and bool(torch.equal(old[: h.num_tokens], new))
        )
        runs.append(ReusedRun(h.start, h.num_tokens, exact, _joins(prev, h)))
        prev = h
    return runs


def _joins(prev: StoredHit | None, h: StoredHit) -> bool:
    """`h` was stored right after the whole of `prev`, from one prompt."""
    before = None if prev is None else computed_after(prev.stored_context)
    return (
        prev is not None
        and prev.num_tokens == len(prev.segment.ids)
        and before is not None
        and computed_after(h.stored_context) == chain_id(before, prev.segment.ids)
    )


def chunk_spans(runs: list[ReusedRun], merge: bool) -> list[tuple[int, int]]:
    """(start, end) of every reused chunk. With `merge`, a run joins the chunk before it when
    it follows that chunk's last run in this prompt and was stored right after it, from one
    prompt (`ReusedRun.joins_previous`): the KV in the span was computed together, so only
    the span's start saw a context that changed since."""
    spans: list[tuple[int, int]] = []
    for r in runs:
        if merge and spans and spans[-1][1] == r.start and r.joins_previous:
            spans[-1] = (spans[-1][0], r.end)
        else:
            spans.append((r.start, r.end))
    return spans


def exact_mask(prompt: TokenizedPrompt, hits: Sequence[StoredHit], positions: Tensor) -> Tensor:
    """(T,) bool: the tokens of hits stored after this very context at these very positions
    (what `reused_runs` marks exact with `exact_prefix`), whatever the strategy's options."""
    mask = torch.zeros(prompt.num_tokens, dtype=torch.bool)
    for r in reused_runs(prompt, hits, positions, _EXACT):
        mask[r.start : r.end] = r.exact
    return mask


@dataclass(frozen=True)
class _ExactPrefix:
    exact_prefix: bool = True


_EXACT = _ExactPrefix()
