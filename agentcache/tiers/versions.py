"""Dirty pages: after a reuse prefill, the pages of reused segments holding recomputed or
fused tokens carry a newer K/V version than the store's copy. This hands that version to a
tiered store, page by page, with the slots of the changed tokens (their count is the page's
dirty count); the store keeps the rest of each page as it was stored.

    segment   : [ page 0 ][ page 1 ][ page 2 ]        page j = segment tokens [16j, 16j+16)
    dirty     :   . . x .   . . . .   x x . .         -> pages 0 (slot 2), 2 (slots 0, 1)
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import SegmentStore, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedSegment
from agentcache.tiers.base import PageData
from agentcache.tiers.store import TieredSegmentStore


def adopt_recomputed(
    store: SegmentStore,
    model: LoadedModel,
    segments: Iterable[TokenizedSegment],
    seq: SequenceKV,
    positions: Tensor,
    dirty: Tensor,
) -> int:
    """Update the stored `segments` (the prompt's reusable ones, keyed as the selective
    strategies store them: `segment_content_id`, scope included) whose tokens are marked in
    `dirty` (T,) with this request's K/V of their dirty pages. Returns pages updated."""
    if not isinstance(store, TieredSegmentStore) or not bool(dirty.any()):
        return 0
    m = model
    size = store.config.page_size
    updated = 0
    for seg in segments:
        if not bool(dirty[seg.start : seg.end].any()):
            continue
        updates: dict[int, tuple[PageData, int]] = {}
        for j, first in enumerate(range(seg.start, seg.end, size)):
            span = slice(first, min(first + size, seg.end))
            changed = sum(1 << i for i in dirty[span].nonzero().flatten().tolist())
            if changed:
                keys, values = seq.gather_all(span)
                updates[j] = (PageData(keys, values, positions[span].clone()), changed)
        cid = segment_content_id(seg.ids, seg.segment.scope)
        if store.update_pages(m.model_id, m.tokenizer.tokenizer_id, cid, updates):
            updated += len(updates)
    return updated
