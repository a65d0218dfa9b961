"""Finding a prompt's reusable segments in the store, and storing a turn's segments.

A segment's KV is stored the first time it is computed, under its content key (model +
tokenizer + token ids), with the positions it was encoded at and the id of everything before
it (its context): the first copy. A later prompt with that context at those positions reuses
it as an exact run; elsewhere it is reused approximately.

Exact copies: when a turn found a segment's copy but not exact here (another context or
position) and then computed every token of it, with every token before it computed or reused
exactly (`ExactKV`), the commit stores that KV as the segment's exact copy for this context
(`exact_copy_id`, in the segment's scope). A later prompt with the same context finds it
first, as an exact run. Reused (approximate) KV is never stored as an exact copy. Copies
are ordinary entries: bounded by the store's bytes and evicted by its policy.

Context copies: a segment a turn found but not exact here and reused approximately (a
selection recomputed, the rest re-rotated or fused) is stored after the turn, at the
positions it was encoded at, as its context copy for this context (`context_copy_id`, in
the segment's scope): the KV the turn used for it. A later prompt with the same context
finds the exact copy first, then the context copy, then the first copy; a context copy is
stored after this very context at these positions, so it is an exact run there: loaded as it
is, nothing probed or recomputed, the same KV the earlier turn's output was computed with
(counted apart: `ReuseStats.context_copy_tokens`). Not used where outputs must equal full
recompute's (`context_copies=False`: the planner's exact floor).

Inexact first copies: a segment first stored by a turn that reused K/V before it
approximately was computed after that approximate K/V, so its K/V is not full recompute's even
after its own context. Its first copy is stored under its context marked inexact
(`kv.store.inexact_context`): no prompt takes it for an exact run; a later prompt with the same
context finds it as a context copy (what the earlier turn used there), and without context
copies as a copy computed elsewhere, to recompute. Nor does the head index offer its opening.

    prompt 1 : [ sys t1 ][ tools ][ q1 ]   tools' first copy, context "sys t1"
    prompt 2 : [ sys t2 ][ tools ][ long q2 ]   tools found, not exact; all computed
               -> tools' exact copy for context "sys t2"
    prompt 3 : [ sys t2 ][ tools ][ q3 ]   tools found exact: loaded, nothing recomputed

Repeated texts: a text that occurs more than once in one prompt (a cleared tool result's
placeholder, a repeated "OK") is stored once under its content key, at its first place; every
later occurrence the commit stores as its copy for its own context: the exact copy where its
K/V is full recompute's, else the context copy (what this turn used there). The next turn,
with the same context, finds each as an exact run, as exact prefix reuse finds them.

Heads: a segment whose text is not in the store (a tools block with another tool list, a
memory block with a line added at its end) may still open with the tokens of a segment stored
after this very context, at these positions: those tokens' K/V is exact here (each token's
K/V depends only on the tokens before it), as far as the two agree. The commit remembers,
per scope and context, the last few segments stored there (`HeadIndex`, bounded in tokens);
a missed segment loads the longest such opening as an exact run (`SegmentHit.head`), and
the rest of it is computed. The miss is still recorded: its text was not found.

    stored   : [ sys ][ # Tools ... fn_a fn_b ]       after context "sys"
    prompt   : [ sys ][ # Tools ... fn_c ]            opening shared up to "fn_"
               exact  [ head #######][computed]

An update segment is computed, never looked up, but its opening is found the same way (a new
user message's chat header, the lines of a state block that stayed): what exact prefix reuse
finds there, the selective strategies find too (`ReuseContext.update_heads`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import (
    StoredKV,
    chain_id,
    context_copy_id,
    exact_copy_id,
    inexact_context,
    scoped_namespace,
    segment_content_id,
)
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.base import ReuseContext, ReuseStats, SegmentMiss

REUSABLE = (SegmentKind.SYSTEM, SegmentKind.FIXED)


@dataclass(frozen=True)
class SegmentHit:
    segment: TokenizedSegment
    kv: StoredKV
    num_tokens: int  # tokens reused: the whole segment, less the prompt's last token
    copy: bool = False  # found as the segment's exact copy for this prompt's context
    context_copy: bool = False  # found as its context copy for this prompt's context
    # the segment's text was not found; these are the first tokens of another segment stored
    # after this very context that opens with them (`HeadIndex`)
    head: bool = False

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


# the last prompt's chain: (its ids, its segments, the chain), matched by identity
_last_chain: tuple[tuple[int, ...], tuple[TokenizedSegment, ...], tuple[str, ...]] = ((), (), ())


def chain_ids(prompt: TokenizedPrompt) -> tuple[str, ...]:
    """Chained id of the tokens before each segment, then of the whole prompt (n + 1 ids):
    `chain_ids(p)[i + 1]` identifies everything through segment i. The last prompt's are
    kept (its prefill, its runs and its commit read them)."""
    global _last_chain
    ids, segments, chain = _last_chain
    if ids is prompt.ids and segments is prompt.segments:
        return chain
    out, prev = [], "context-root"
    for seg in prompt.segments:
        out.append(prev)
        prev = chain_id(prev, seg.ids)
    out.append(prev)
    _last_chain = (prompt.ids, prompt.segments, tuple(out))
    return _last_chain[2]


def context_ids(prompt: TokenizedPrompt) -> list[str]:
    """Chained id of the tokens before each segment."""
    return list(chain_ids(prompt)[:-1])


def find_hits(
    ctx: ReuseContext,
    prompt: TokenizedPrompt,
    stats: ReuseStats,
    namespace: str = "segment",
    at_start: bool = False,
) -> list[SegmentHit]:
    """Look up every system/fixed segment: its exact copy for this context first, then (with
    `ctx.context_copies`) its context copy for this context, then its first copy; record misses
    (and the time, `stats.lookup_s`). `at_start` keys by absolute start (no copies)."""
    t0 = time.perf_counter()
    m = ctx.model
    model_id, tokenizer_id = m.model_id, m.tokenizer.tokenizer_id
    chain = None if at_start else chain_ids(prompt)
    hits = []
    for i, seg in enumerate(prompt.segments):
        if seg.kind not in REUSABLE:
            # an update is computed, but the opening it shares with a segment stored after
            # this very context (its message framing, the lines of a state block that stayed)
            # is exact here, as prefix reuse finds it
            if not ctx.update_heads or chain is None:
                continue
            if head := _head(ctx, prompt, seg, chain[i], namespace):
                hits.append(head)
                stats.head_tokens += head.num_tokens
            continue
        found, copy, context_copy = None, False, False
        if chain is not None:  # a presence check first: an absent copy counts no miss
            ids = [exact_copy_id(chain[i + 1], seg.segment.scope, seg.start, namespace)]
            if ctx.context_copies:
                ids.append(context_copy_id(chain[i + 1], seg.segment.scope, seg.start, namespace))
            for k, cid in enumerate(ids):
                if ctx.store.contains_content(model_id, tokenizer_id, cid):
                    found = ctx.store.lookup_content(model_id, tokenizer_id, cid)
                    if found.kv is not None:
                        copy, context_copy = k == 0, k == 1
                        break
        if not (copy or context_copy):
            start = seg.start if at_start else None
            space = scoped(namespace, seg)
            found = ctx.store.lookup(model_id, tokenizer_id, seg.ids, space, start)
            kv = found.kv
            # a first copy computed after K/V reused approximately is exact nowhere, but it
            # is what an earlier turn used after this very context: there, a context copy
            here = None if chain is None or not ctx.context_copies else chain[i]
            if kv is not None and here is not None and kv.context_id == inexact_context(here):
                found = replace(found, kv=replace(kv, context_id=here))
                context_copy = True
        assert found is not None
        if found.kv is None:
            assert found.miss is not None
            stats.misses.append(SegmentMiss(seg.segment.id, seg.kind, len(seg.ids), found.miss))
            if chain is not None and (head := _head(ctx, prompt, seg, chain[i], namespace)):
                hits.append(head)
                stats.head_tokens += head.num_tokens
            continue
        stats.copies_found += copy
        stats.context_copies_found += context_copy
        n = reusable_tokens(prompt, seg)
        if n > 0:
            hits.append(SegmentHit(seg, found.kv, n, copy, context_copy))
            stats.context_copy_tokens += n if context_copy else 0
    stats.lookup_s += time.perf_counter() - t0
    return hits


# tokens: any shared opening is loaded (a message's framing alone, `<|im_start|>user`, is a
# few); so the default loads at least what `prefix`'s blocks load wherever they reach
MIN_HEAD = 1
HEAD_CANDIDATES = 4  # segments remembered per (scope, context), the newest first
HEAD_TOKENS = 1 << 22  # tokens the index holds at most, over every context (int32: 16 MiB)


class HeadIndex:
    """Per store: (namespace, context id) -> the content ids and token ids of the last
    `HEAD_CANDIDATES` segments stored after that context; the least recently stored contexts
    leave first beyond `max_tokens`. Holds no K/V: an entry the store has dropped since is
    skipped at lookup. Thread-safe."""

    def __init__(self, max_tokens: int = HEAD_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._by_context: dict[tuple[str, str], list[tuple[str, Tensor]]] = {}
        self._tokens = 0
        self._lock = threading.Lock()

    def add(self, space: str, context: str, cid: str, ids: Sequence[int]) -> None:
        if len(ids) < MIN_HEAD or len(ids) > self.max_tokens:
            return
        key = (space, context)
        with self._lock:
            entries = self._by_context.pop(key, [])  # re-inserted last: the newest
            if any(c == cid for c, _ in entries):
                self._by_context[key] = entries
                return
            entries.insert(0, (cid, torch.tensor(ids, dtype=torch.int32)))
            self._tokens += len(ids)
            for _, dropped in entries[HEAD_CANDIDATES:]:
                self._tokens -= len(dropped)
            entries = entries[:HEAD_CANDIDATES]
            self._by_context[key] = entries
            while self._tokens > self.max_tokens and len(self._by_context) > 1:
                oldest = next(iter(self._by_context))  # never `key`: it was inserted last
                self._tokens -= sum(len(t) for _, t in self._by_context.pop(oldest))
            while self._tokens > self.max_tokens:  # this context alone: its oldest leave
                self._tokens -= len(entries.pop()[1])

    def longest(
        self, space: str, context: str, ids: Sequence[int] | Tensor
    ) -> list[tuple[str, int]]:
        """(content id, tokens shared with `ids` from the start) of every segment stored after
        `context` in `space`, the longest first. `ids` become a tensor only when there is an
        entry to compare them with (most missed segments have none)."""
        with self._lock:
            entries = list(self._by_context.get((space, context), ()))
        if not entries:
            return []
        ids = torch.as_tensor(ids, dtype=entries[0][1].dtype)
        out = []
        for cid, stored in entries:
            m = min(len(stored), len(ids))
            differ = (stored[:m] != ids[:m]).nonzero()
            out.append((cid, m if len(differ) == 0 else int(differ[0])))
        return sorted(out, key=lambda e: -e[1])


_HEADS: weakref.WeakKeyDictionary[object, HeadIndex] = weakref.WeakKeyDictionary()
_HEADS_LOCK = threading.Lock()


def head_index(store: object) -> HeadIndex:
    """The head index of `store` (made on first use, gone with the store)."""
    with _HEADS_LOCK:
        index = _HEADS.get(store)
        if index is None:
            index = _HEADS[store] = HeadIndex()
        return index


def _head(
    ctx: ReuseContext, prompt: TokenizedPrompt, seg: TokenizedSegment, context: str,
    namespace: str,
) -> SegmentHit | None:  # fmt: skip
    """The longest opening of `seg` that a segment stored after this very `context`, at these
    positions, shares with it (`MIN_HEAD` tokens or more), as an exact run; None: none."""
    m = ctx.model
    found: dict[str, StoredKV] = {}

    def where(cid: str) -> tuple[str, Tensor] | None:
        if not ctx.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid):
            return None  # dropped since: no lookup, so no miss is counted twice
        kv = ctx.store.lookup_content(m.model_id, m.tokenizer.tokenizer_id, cid).kv
        if kv is None or kv.context_id is None:
            return None  # never stored after this context
        found[cid] = kv
        return kv.context_id, kv.positions

    head = longest_head(head_index(ctx.store), prompt, seg, context, where, namespace)
    return None if head is None else SegmentHit(seg, found[head[0]], head[1], head=True)


# content id -> (the context it was stored after, its positions), None: not usable
HeadSource = Callable[[str], tuple[str, Tensor] | None]


def longest_head(
    index: HeadIndex, prompt: TokenizedPrompt, seg: TokenizedSegment, context: str,
    where: HeadSource, namespace: str = "segment",
) -> tuple[str, int] | None:  # fmt: skip
    """(content id, tokens) of the longest opening of `seg` shared with a segment `index`
    names after `context` that `where` says was stored after this very context at these very
    positions (`MIN_HEAD` tokens or more, the prompt's last token never); None: none. The
    strategies' lookup (`where` reads the store) and the planner's (its own metadata) share it."""
    limit = reusable_tokens(prompt, seg)
    if limit < MIN_HEAD:
        return None
    for cid, n in index.longest(scoped(namespace, seg), context, seg.ids):
        n = min(n, limit)
        if n < MIN_HEAD:
            break
        source = where(cid)
        if source is None or source[0] != context:
            continue
        here = torch.arange(seg.start, seg.start + n)
        if not bool(torch.equal(source[1][:n], here)):
            continue
        return cid, n
    return None


def reusable_tokens(prompt: TokenizedPrompt, seg: TokenizedSegment) -> int:
    """Tokens of a stored segment a prompt reuses: all of them but the prompt's last token,
    which is always computed (it gives the first output token)."""
    return min(len(seg.ids), prompt.num_tokens - 1 - seg.start)


@dataclass(frozen=True)
class ExactKV:
    """What a prefill leaves its commit about the sequence's K/V: the first `exact_tokens`
    tokens of the prompt (`ids`) hold K/V equal, up to rounding, to full recompute's at their
    own indices (each computed fresh through every layer, or reused from a copy exact here,
    after only such tokens), and the (start, end) of every segment found in the store but not
    exact here whose tokens all lie inside them (computed fresh in this context: what the
    store has no exact copy of), and of every such segment reused approximately instead, whole
    and at its own positions (`approximate`: what the store has no context copy of)."""

    ids: tuple[int, ...]
    exact_tokens: int
    recomputed: tuple[tuple[int, int], ...]
    approximate: tuple[tuple[int, int], ...] = ()

    def exact_for(self, prompt: TokenizedPrompt) -> int:
        """Exact leading tokens of `prompt`: this prefill's prompt, or it continued by the
        tokens decoded after it (exact when the whole prompt was); 0 for another prompt."""
        n = len(self.ids)
        if prompt.num_tokens < n or prompt.ids[:n] != self.ids:
            return 0
        return prompt.num_tokens if self.exact_tokens == n else self.exact_tokens


_LEFT: weakref.WeakKeyDictionary[SequenceKV, ExactKV] = weakref.WeakKeyDictionary()
_LEFT_LOCK = threading.Lock()


def exact_prefix(exact: Tensor, positions: Tensor) -> int:
    """Leading tokens of mask `exact` (T,) that are exact at their own indices."""
    ok = exact & (positions == torch.arange(len(positions)))
    bad = (~ok).nonzero()
    return len(ok) if len(bad) == 0 else int(bad[0])


def leave_exact(
    seq: SequenceKV,
    prompt: TokenizedPrompt,
    hits: Sequence[SegmentHit],
    exact_kv: Tensor,
    exact_runs: Tensor,
    positions: Tensor,
) -> ExactKV:
    """Record for `commit_segments` which of `seq`'s K/V is exact: `exact_kv` (T,) marks the
    tokens computed fresh through every layer or reused exactly, `exact_runs` (T,) the
    reused ones whose stored copy is exact here."""
    n = exact_prefix(exact_kv, positions)
    recomputed = tuple(
        (h.segment.start, h.segment.end)
        for h in hits
        if h.segment.end <= n and not bool(exact_runs[h.start : h.end].all())
    )
    natural = torch.arange(len(positions))
    approximate = tuple(
        (h.segment.start, h.segment.end)
        for h in hits
        if (h.segment.start, h.segment.end) not in recomputed
        and h.num_tokens == len(h.segment.ids)
        and not bool(exact_runs[h.start : h.end].all())
        and bool(torch.equal(positions[h.start : h.end], natural[h.start : h.end]))
    )
    record = ExactKV(prompt.ids, n, recomputed, approximate)
    with _LEFT_LOCK:
        _LEFT[seq] = record
    return record


def exact_left(seq: SequenceKV) -> ExactKV | None:
    """The record the last prefill into `seq` left (None: none did, or not a selective one)."""
    with _LEFT_LOCK:
        return _LEFT.get(seq)


def commit_segments(
    ctx: ReuseContext,
    prompt: TokenizedPrompt,
    seq: SequenceKV,
    positions: Tensor,
    namespace: str = "segment",
    at_start: bool = False,
) -> None:
    """Store every segment of the prompt not stored yet (update segments too: today's update
    is tomorrow's history), the exact copy of every segment the prefill found not exact and
    computed exactly (`ExactKV.recomputed`), and the context copy of every one it reused
    approximately (`ExactKV.approximate`), unless one is stored for this context. Hits come
    from the segment's own scope only, so a copy never holds another scope's KV."""
    m = ctx.model
    left = None if at_start else exact_left(seq)
    copies = () if left is None or left.exact_for(prompt) == 0 else left.recomputed
    ours = left is not None and prompt.ids[: len(left.ids)] == left.ids
    approximate = left.approximate if left is not None and ours else ()
    # leading tokens whose K/V is full recompute's (a strategy that leaves no record computes
    # or reuses every token exactly)
    exact = prompt.num_tokens if left is None else left.exact_for(prompt)
    chain = chain_ids(prompt)
    firsts: set[str] = set()  # first copies this commit stored
    for i, seg in enumerate(prompt.segments):
        start, context = (seg.start if at_start else None), chain[i]
        # a first copy whose K/V is not full recompute's here (computed after K/V reused
        # approximately) is stored under its context marked inexact: found as a context
        # copy in this context, never as an exact run
        inexact, first = False, False
        context_copy = (seg.start, seg.end) in approximate
        if (seg.start, seg.end) in copies:
            cid = exact_copy_id(chain[i + 1], seg.segment.scope, seg.start, namespace)
        elif context_copy:
            cid = context_copy_id(chain[i + 1], seg.segment.scope, seg.start, namespace)
        else:
            cid = segment_content_id(seg.ids, seg.segment.scope, namespace, start)
            inexact, first = seg.end > exact, True
            if cid in firsts and not at_start:
                # the same text earlier in this prompt (a cleared tool result's placeholder,
                # a repeated "OK"): its first copy is that one, after another context. This
                # one's K/V is stored as its copy for this context: exact, or (computed after
                # K/V reused approximately) the context copy, what this turn used here
                copy_id = context_copy_id if inexact else exact_copy_id
                cid = copy_id(chain[i + 1], seg.segment.scope, seg.start, namespace)
                inexact, first, context_copy = False, False, inexact
        # what the store holds after this context, as computed here (a context copy is not:
        # it holds the KV an earlier turn used approximately)
        headed = not at_start and not context_copy and not inexact
        if ctx.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid):
            continue
        span = slice(seg.start, seg.end)
        if seq.holes is not None and bool(seq.holes[span].any()):
            continue  # a sliding-window layer holds no K/V for some of its tokens
        keys, values = seq.gather_all(span)
        stored_after = inexact_context(context) if inexact else context
        kv = StoredKV(
            keys, values, positions[span].clone(), m.model_id, m.tokenizer.tokenizer_id,
            stored_after,
        )  # fmt: skip
        if not ctx.store.put_content(cid, kv):
            continue
        if first:
            firsts.add(cid)
        if headed:
            head_index(ctx.store).add(scoped(namespace, seg), context, cid, seg.ids)
