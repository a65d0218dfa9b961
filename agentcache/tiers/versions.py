"""Dirty pages: after a reuse prefill, the pages of reused segments holding recomputed or
fused tokens carry a newer K/V version than the store's copy. This hands that version to a
tiered store, page by page, with the slots of the changed tokens (their count is the page's
dirty count); the store keeps the rest of each page as it was stored.

    segment   : [ page 0 ][ page 1 ][ page 2 ]        page j = segment tokens [16j, 16j+16)
    dirty     :   . . x .   . . . .   x x . .         -> pages 0 (slot 2), 2 (slots 0, 1)
"""

from __future__ import annotations

from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import segment_content_id
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import ReuseContext
from agentcache.reuse.segments import REUSABLE
from agentcache.tiers.base import PageData
from agentcache.tiers.store import TieredSegmentStore


def adopt_recomputed(
    ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor, dirty: Tensor
) -> int:
    """Update the stored segments (selective strategies' namespace) whose tokens are marked in
    `dirty` (T,) with this request's K/V of their dirty pages. Returns pages updated."""
    store = ctx.store
    if not isinstance(store, TieredSegmentStore) or not bool(dirty.any()):
        return 0
    m = ctx.model
    size = store.config.page_size
    updated = 0
    for seg in prompt.segments:
        if seg.kind not in REUSABLE or not bool(dirty[seg.start : seg.end].any()):
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
