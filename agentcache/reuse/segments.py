"""Finding a prompt's reusable segments in the store, and storing a turn's segments.

A segment's KV is stored once, the first time it is computed, under its content key (model +
tokenizer + token ids), with the positions it was encoded at and the id of everything before
it. Later copies are not stored over it: reused KV is approximate, the first copy is not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import StoredKV, chain_id, scoped_namespace, segment_content_id
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.base import ReuseContext, ReuseStats, SegmentMiss

REUSABLE = (SegmentKind.SYSTEM, SegmentKind.FIXED)


@dataclass(frozen=True)
class SegmentHit:
    segment: TokenizedSegment
    kv: StoredKV
    num_tokens: int  # tokens reused: the whole segment, less the prompt's last token

    @property
    def start(self) -> int:
        return self.segment.start

    @property
    def end(self) -> int:
        return self.segment.start + self.num_tokens

    @property
    def stored_context(self) -> str | None:
        return self.kv.context_id

    @property
    def stored_positions(self) -> Tensor:
        return self.kv.positions


def scoped(namespace: str, seg: TokenizedSegment) -> str:
    """A segment with a scope is keyed in its own namespace, so other scopes never see it."""
    return scoped_namespace(namespace, seg.segment.scope)


def context_ids(prompt: TokenizedPrompt) -> list[str]:
    """Chained id of the tokens before each segment."""
    ids, prev = [], "context-root"
    for seg in prompt.segments:
        ids.append(prev)
        prev = chain_id(prev, seg.ids)
    return ids


def find_hits(
    ctx: ReuseContext,
    prompt: TokenizedPrompt,
    stats: ReuseStats,
    namespace: str = "segment",
    at_start: bool = False,
) -> list[SegmentHit]:
    """Look up every system/fixed segment; record misses (and the time, `stats.lookup_s`).
    `at_start` keys by absolute start."""
    t0 = time.perf_counter()
    m = ctx.model
    hits = []
    for seg in prompt.segments:
        if seg.kind not in REUSABLE:
            continue
        start = seg.start if at_start else None
        space = scoped(namespace, seg)
        found = ctx.store.lookup(m.model_id, m.tokenizer.tokenizer_id, seg.ids, space, start)
        if found.kv is None:
            assert found.miss is not None
            stats.misses.append(SegmentMiss(seg.segment.id, seg.kind, len(seg.ids), found.miss))
            continue
        n = reusable_tokens(prompt, seg)
        if n > 0:
            hits.append(SegmentHit(seg, found.kv, n))
    stats.lookup_s += time.perf_counter() - t0
    return hits


def reusable_tokens(prompt: TokenizedPrompt, seg: TokenizedSegment) -> int:
    """Tokens of a stored segment a prompt reuses: all of them but the prompt's last token,
    which is always computed (it gives the first output token)."""
    return min(len(seg.ids), prompt.num_tokens - 1 - seg.start)


def commit_segments(
    ctx: ReuseContext,
    prompt: TokenizedPrompt,
    seq: SequenceKV,
    positions: Tensor,
    namespace: str = "segment",
    at_start: bool = False,
) -> None:
    """Store every segment of the prompt not stored yet (update segments too: today's update
    is tomorrow's history)."""
    m = ctx.model
    for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
        start = seg.start if at_start else None
        cid = segment_content_id(seg.ids, seg.segment.scope, namespace, start)
        if ctx.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid):
            continue
        span = slice(seg.start, seg.end)
        if seq.holes is not None and bool(seq.holes[span].any()):
            continue  # a sliding-window layer holds no K/V for some of its tokens
        keys, values = seq.gather_all(span)
        kv = StoredKV(
            keys, values, positions[span].clone(), m.model_id, m.tokenizer.tokenizer_id, context
        )
        ctx.store.put_content(cid, kv)
