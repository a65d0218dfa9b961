"""Verified sparse decode: greedy self-speculative decoding as a `Decoder` (DecodeConfig.verify).

The sparse decoder drafts up to `draft` tokens and one dense pass verifies them
(`SparseDecoder.advance`); the pass covers the last draft too, so a round whose drafts dense
agrees with brings dense's next token as well (the bonus, when the turn has room for it). The
tokens dense greedy decoding emits come back one per `feed` (draft = 3, dense parting at d3):

    feed(t0)  -> advance(t0) = [t1, t2, t3]  KV: t0 t1 t2    returns t1
    feed(t1)  -> (queued)                                   returns t2
    feed(t2)  -> (queued)                                   returns t3
    feed(t3)  -> advance(t3) = [...]         KV: + t3 ...

In batched steps (`begin_step`) a round's drafts are rows, one per step, beside the other
turns' rows: each row's `take` reads the sparse argmax and begins the next draft's row; the
last one's begins the dense pass as a row of the round's tokens and its last draft
(`SparseDecoder.begin_verify`), which runs in the next step, its tokens rows of the step's
matrix products beside the others', and whose `take` accepts the drafts
(`SparseDecoder.accept`) and answers t1. The scheduler then feeds the turn the rest in the
same step (`queued`: `feed` answers them from the queue, no model work), so a round takes a
step per draft and one for its pass. Same tokens, same KV as `feed`, the reference it is
tested against (to the rounding of the matrix products' row count, as any row alone and in a
batch).

    step s     row(t0)              -> take: d1, begins row(d1)      the turn is fed nothing
    step s+1   row(d1)              -> take: d2, begins row(d2)
    step s+2   row(d2)              -> take: d3, begins verify(t0 d1 d2 d3)
    step s+3   verify(t0 d1 d2 d3)  -> take: [t1, t2, t3]          the turn is fed t1, then
               feed(t1) -> t2, feed(t2) -> t3 from the queue       (t1 and t2 chosen)
    step s+4   t3 chosen, begin_step(t3): the next round's first draft

(had dense agreed with d1 d2 d3, the pass's take would have answered [d1, d2, d3, t4].)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from agentcache.decode.base import Decoder, StepRow
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.stats import DecodeStats
from agentcache.model.llama import LlamaForward


@dataclass
class _Round:
    """A round of drafts stepped in batched steps: begun at token index `start`, position
    `position`; `fed` the tokens appended so far, `drafts` the sparse argmax after each."""

    start: int
    position: int
    limit: int  # drafts in this round at most
    fed: list[int]
    bonus: bool  # the pass covers the last draft too (`SparseDecoder.advance`)
    drafts: list[int] = field(default_factory=list)


class VerifiedDecoder(Decoder):
    """Greedy only: the tokens are dense greedy decoding's. `stop_ids` end a draft early."""

    def __init__(self, sparse: SparseDecoder, draft: int, stop_ids: frozenset[int]) -> None:
        if draft < 1:
            raise ValueError(f"draft must be >= 1 (got {draft})")
        self.sparse, self.draft, self.stop_ids = sparse, draft, stop_ids
        # verified tokens not returned yet; the KV holds all but the last
        self._queue: list[int] = []
        self._round: _Round | None = None  # drafts being stepped as rows of batched steps

    def feed(self, token: int, position: int, room: int) -> int:
        if self._round is not None:
            raise RuntimeError("fed while a round of drafts runs in batched steps")
        if not self._queue:
            limit = self._limit(room)
            self._queue = self.sparse.advance(token, position, limit, self.stop_ids, room > limit)
        return self._queue.pop(0)

    def begin_step(
        self, forward: LlamaForward, token: int, position: int, room: int
    ) -> StepRow | None:
        """None while verified tokens are queued (`feed` answers from them); else a round
        begins: its first draft's row, `token` at `position` in the sparse decoder."""
        if self._queue or self._round is not None:
            return None
        start = self.sparse.kv.num_tokens
        row = self.sparse.begin_step(forward, token, position, room)
        if row is None:
            return None
        limit = self._limit(room)
        self._round = _Round(start, position, limit, [token], room > limit)
        return DraftRow(self, row)

    def queued(self) -> int:
        return len(self._queue) if self._round is None else 0

    def _limit(self, room: int) -> int:
        return max(min(self.draft, room), 1)

    def _drafted(self, logits: Tensor) -> StepRow:
        """A draft row's logits (1, V): the next draft's row, begun, or once the round has its
        drafts (as `SparseDecoder.advance` stops) its dense pass's row."""
        r = self._round
        assert r is not None
        r.drafts.append(int(logits[-1].argmax()))
        if len(r.drafts) < r.limit and r.drafts[-1] not in self.stop_ids:
            r.fed.append(r.drafts[-1])
            position = r.position + len(r.fed) - 1
            row = self.sparse.begin_step(self.sparse.f, r.drafts[-1], position, 0)
            assert row is not None  # the decoder's own forward
            return DraftRow(self, row)
        if r.bonus and r.drafts[-1] not in self.stop_ids:
            r.fed.append(r.drafts[-1])  # appended by the pass
        return PassRow(self, self.sparse.begin_verify(r.fed, r.start, r.position))

    def _verified(self, logits: Tensor) -> int:
        """The dense pass's logits (n, V): the round's first verified token, the rest queued."""
        r = self._round
        assert r is not None
        self._round = None
        self._queue = self.sparse.accept(r.drafts, r.start, logits)
        return self._queue.pop(0)

    def stats(self) -> DecodeStats:
        return self.sparse.stats()


class _RoundRow(StepRow):
    """A row of a verified decoder's round: the sparse decoder's row (a draft's step, or the
    dense pass), whose logits go to the round, not to the turn."""

    def __init__(self, decoder: VerifiedDecoder, row: StepRow) -> None:
        super().__init__(row.tokens, row.positions)
        self.decoder, self.row, self.kind = decoder, row, row.kind

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.row.attend(layer, q, k, v)

    def end(self) -> None:
        self.row.end()


class DraftRow(_RoundRow):
    """A draft's step: its logits draft the next token (`VerifiedDecoder._drafted`)."""

    def take(self, logits: Tensor) -> StepRow:
        return self.decoder._drafted(logits)


class PassRow(_RoundRow):
    """The round's dense pass: its logits verify the drafts (`VerifiedDecoder._verified`)."""

    def take(self, logits: Tensor) -> int:
        return self.decoder._verified(logits)
