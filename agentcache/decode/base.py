"""The decode seam: what the engine's decode loop asks of a decoder after prefill.

The loop samples a token from the prefill's logits, then, token by token:

    next = decoder.feed(token, position, room)
      logits (V,)  -> the loop samples the next token from them
      int          -> the next token, already chosen (greedy verified decoding)
      None         -> the decoder holds no more tokens: the turn ends as at the last position

Implementations: `dense.DenseDecoder` (the engine's page pool), `decoder.SparseDecoder`
(per-head top-K pages), `verified.VerifiedDecoder` (sparse drafts, dense verification).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from agentcache.decode.stats import DecodeStats


class Decoder(ABC):
    """One sequence's decode state after prefill.

    Contract: `feed` appends `token` at `position` to the sequence's KV (or finds it there: a
    verified decoder's chosen tokens already are) and returns the logits after it (V,, owned by
    the caller), the next token when the decoder chose it, or None when it holds no more tokens
    (nothing appended then). `room` (>= 0) is how many tokens the turn may still take after
    `token`; a decoder may prepare up to that many ahead. `stats` reads the figures so far, None
    for a decoder that keeps none."""

    @abstractmethod
    def feed(self, token: int, position: int, room: int) -> Tensor | int | None:
        """Append `token` at `position`; what comes after it (see the class contract)."""

    def stats(self) -> DecodeStats | None:
        return None
