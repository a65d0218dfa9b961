"""The records of the tiered store's index: a stored segment and each of its pages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentcache.kv.store import SegmentKey
from agentcache.tiers.base import PageKey


@dataclass
class PageState:
    """One page of a stored segment: its size and which tiers hold a copy, how stale."""

    segment: SegmentKey
    index: int
    num_tokens: int
    nbytes: int
    stale: dict[str, int]  # a key per tier holding a copy of the page
    last_use: int
    seq: int = 0  # order the store came to hold the page in (spill candidates are in it)


@dataclass
class SegmentEntry:
    """A stored segment: its identity and its pages, in order."""

    cid: str
    model_id: str
    tokenizer_id: str
    context_id: str | None
    pages: list[PageKey]
    committed: bool = False  # every page has a current disk copy and the index says so

    def record(self) -> dict[str, Any]:
        return {"cid": self.cid, "model": self.model_id, "tok": self.tokenizer_id,
                "context": self.context_id, "pages": list(self.pages)}  # fmt: skip

    @classmethod
    def from_record(cls, rec: Any) -> SegmentEntry | None:
        """A committed segment from its index record (None: not a record `record` writes)."""
        if not isinstance(rec, dict):
            return None
        cid, model, tok = rec.get("cid"), rec.get("model"), rec.get("tok")
        context, pages = rec.get("context"), rec.get("pages")
        if not (isinstance(cid, str) and isinstance(model, str) and isinstance(tok, str)):
            return None
        if not isinstance(pages, list) or not all(isinstance(k, str) for k in pages):
            return None
        if context is not None and not isinstance(context, str):
            return None
        return cls(cid, model, tok, context, [PageKey(k) for k in pages], committed=True)


def mask_slots(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
