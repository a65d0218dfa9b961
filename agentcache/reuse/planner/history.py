"""What the planner knows of the store before any lookup: the metadata of the segments it
committed (positions, preceding context), and whether the store still holds each.

The plan is made from metadata alone so that planning moves no store counter: the chosen
plan's own lookup is the turn's one lookup. The opening a changed segment shares with one
stored after this very context (a head, `reuse/segments.py`) is found the same way: the
store's head index names the candidates, this history's metadata says where each was
computed. A stored segment the planner did not commit (another strategy wrote it into a
shared store) has unknown metadata: the turn cannot be predicted (`Unknown`), and the planner
falls back to an exact plan.

    commit : content id -> (positions (n,), context id)     bounded, least recently used out
    plan   : REUSABLE segment, in store and known  -> PlannedHit
                               in store, not known -> Unknown
                               not in store        -> its head, when one is known
             update segment (with heads)           -> its head, when one is known
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from agentcache.kv.store import segment_content_id
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.runs import PlannedHit
from agentcache.reuse.segments import (
    REUSABLE,
    HeadIndex,
    context_ids,
    longest_head,
    reusable_tokens,
)

MAX_SEGMENTS = 4096

# (content id) -> whether the store holds it, moving no counter (`contains_content`)
StoreProbe = Callable[[str], bool]


@dataclass(frozen=True)
class StoredMeta:
    positions: Tensor  # (n,) positions the stored copy was encoded at
    context_id: str  # chained id of the tokens before it when it was stored


class Unknown(Exception):
    """A segment is in the store but the planner does not know where it was computed."""


class PlanHistory:
    def __init__(self, max_segments: int = MAX_SEGMENTS) -> None:
        self.max_segments = max_segments
        self._meta: OrderedDict[str, StoredMeta] = OrderedDict()

    def __len__(self) -> int:
        return len(self._meta)

    def record(self, prompt: TokenizedPrompt, positions: Tensor) -> None:
        """The segments of a committed prompt (the first copy is kept, as the store keeps)."""
        for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
            cid = segment_content_id(seg.ids, seg.segment.scope)
            if cid in self._meta:
                self._meta.move_to_end(cid)
                continue
            self._meta[cid] = StoredMeta(positions[seg.start : seg.end].clone(), context)
            while len(self._meta) > self.max_segments:
                self._meta.popitem(last=False)

    def hits(
        self, prompt: TokenizedPrompt, stored: StoreProbe, heads: HeadIndex | None = None,
        update_heads: bool = False,
    ) -> list[PlannedHit]:  # fmt: skip
        """The prompt's reusable segments the store holds, with their metadata; `Unknown`
        when one is held that this history never recorded. With the store's head index,
        also the head of each reusable segment the store lacks and (`update_heads`) of each
        update segment, as the selective strategies find them (`segments.find_hits`)."""
        hits = []
        contexts = context_ids(prompt) if heads is not None else []
        for i, seg in enumerate(prompt.segments):
            if seg.kind not in REUSABLE:
                if heads is not None and update_heads:
                    hits += self._head(heads, prompt, i, contexts, stored)
                continue
            cid = segment_content_id(seg.ids, seg.segment.scope)
            if not stored(cid):
                if heads is not None:
                    hits += self._head(heads, prompt, i, contexts, stored)
                continue
            meta = self._meta.get(cid)
            if meta is None:
                raise Unknown(f"segment {seg.segment.id or seg.start} was stored by another")
            n = reusable_tokens(prompt, seg)
            if n > 0:
                hits.append(PlannedHit(seg, n, meta.context_id, meta.positions))
        return hits

    def _head(
        self, heads: HeadIndex, prompt: TokenizedPrompt, i: int, contexts: list[str],
        stored: StoreProbe,
    ) -> list[PlannedHit]:  # fmt: skip
        """Segment i's head as the strategies find it (`segments.longest_head`), read from this
        history's metadata; [] when none is known. A candidate this history did not record is
        passed over: the plan's cost is then an upper bound, as without heads."""
        seg, context = prompt.segments[i], contexts[i]

        def where(cid: str) -> tuple[str, Tensor] | None:
            meta = self._meta.get(cid)
            return None if meta is None or not stored(cid) else (meta.context_id, meta.positions)

        head = longest_head(heads, prompt, seg, context, where)
        if head is None:
            return []
        return [PlannedHit(seg, head[1], context, self._meta[head[0]].positions)]
