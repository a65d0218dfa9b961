"""Verified sparse decode: greedy self-speculative decoding as a `Decoder` (DecodeConfig.verify).

The sparse decoder drafts up to `draft` tokens and one dense pass verifies them
(`SparseDecoder.advance`); the tokens dense greedy decoding emits come back one per `feed`:

    feed(t0)  -> advance(t0) = [t1, t2, t3]  KV: t0 t1 t2    returns t1
    feed(t1)  -> (queued)                                   returns t2
    feed(t2)  -> (queued)                                   returns t3
    feed(t3)  -> advance(t3) = [...]         KV: + t3 ...
"""

from __future__ import annotations

from agentcache.decode.base import Decoder
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.stats import DecodeStats


class VerifiedDecoder(Decoder):
    """Greedy only: the tokens are dense greedy decoding's. `stop_ids` end a draft early."""

    def __init__(self, sparse: SparseDecoder, draft: int, stop_ids: frozenset[int]) -> None:
        if draft < 1:
            raise ValueError(f"draft must be >= 1 (got {draft})")
        self.sparse, self.draft, self.stop_ids = sparse, draft, stop_ids
        # verified tokens not returned yet; the KV holds all but the last
        self._queue: list[int] = []

    def feed(self, token: int, position: int, room: int) -> int:
        if not self._queue:
            draft = max(min(self.draft, room), 1)
            self._queue = self.sparse.advance(token, position, draft, self.stop_ids)
        return self._queue.pop(0)

    def stats(self) -> DecodeStats:
        return self.sparse.stats()
