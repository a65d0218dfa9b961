"""The decode loop: one loop for every decode policy, over the `Decoder` seam.

    logits (prefill) -> sample -> token -> end of text?  stop  (not emitted)
                                        -> emit: ids, on_token (may raise, e.g. cancelled)
                                        -> stop string?  stop
                                        -> max_new_tokens?  length
                                        -> decoder.feed -> logits | chosen token | full: length

`TurnDecoding` is that loop's body, one token at a time (`choose`, then `fed` with what the
decoder returned), so the batched scheduler (`runtime/scheduler.py`) runs the same per-turn
logic for many turns at once; `decode_loop` runs it for one turn. The decoder is chosen by the
engine (`DecodeSetup.decoder`); nothing here depends on which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from agentcache.decode.base import Decoder
from agentcache.model.tokenizer import TextTokenizer
from agentcache.runtime.params import GenerationParams
from agentcache.runtime.sampling import constrain, sample
from agentcache.runtime.stops import StopMatcher


class Feed(NamedTuple):
    """What the decoder is fed next: `Decoder.feed`'s arguments."""

    token: int
    position: int
    room: int


class TurnDecoding:
    """One turn's decode state after a prefill whose last logits are `logits` (V,), the first
    new token going at `position`. `finish` is None while the turn runs, then "stop" (end of
    text or a stop string) or "length" (max_new_tokens, the model's positions, or a decoder
    that holds no more)."""

    def __init__(
        self,
        logits: Tensor,
        position: int,
        params: GenerationParams,
        max_positions: int,
        tokenizer: TextTokenizer,
    ) -> None:
        self.params, self.max_positions = params, max_positions
        self.gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        self.eos = tokenizer.eos_token_ids
        self.stops = StopMatcher(tokenizer.decode, params.stop) if params.stop else None
        self.ids: list[int] = []
        self.after: Tensor | int = logits
        self.position = position
        self.finish: str | None = None
        self._check_room()

    def choose(self) -> int | None:
        """The next token, from the decoder's last answer; None at end of text (not emitted).
        Sets `finish` when the turn ends with this token."""
        after = self.after
        p = self.params
        if isinstance(after, int):
            token = after
        else:
            logits = constrain(after, p.constraint, self.ids)  # structured outputs, logprobs
            token = sample(logits, p.temperature, p.top_p, self.gen)
        if token in self.eos:
            self.finish = "stop"
            return None
        self.ids.append(token)
        if self.stops is not None and self.stops.feed(token):
            self.finish = "stop"
        elif len(self.ids) == p.max_new_tokens:
            self.finish = "length"
        return token

    def feed(self) -> Feed:
        """The decoder's next input: the last token chosen, while the turn runs."""
        left = self.params.max_new_tokens - len(self.ids)
        room = min(left, self.max_positions - self.position - 1)
        return Feed(self.ids[-1], self.position, room)

    def fed(self, after: Tensor | int | None) -> None:
        """The decoder's answer to `feed()` (see `Decoder.feed`)."""
        if after is None:
            self.finish = "length"
            return
        self.after, self.position = after, self.position + 1
        self._check_room()

    def _check_room(self) -> None:
        if not (len(self.ids) < self.params.max_new_tokens and self.position < self.max_positions):
            self.finish = "length"


def decode_loop(
    decoder: Decoder,
    logits: Tensor,
    position: int,
    params: GenerationParams,
    max_positions: int,
    tokenizer: TextTokenizer,
    on_token: Callable[[int], None] | None = None,
) -> tuple[list[int], str]:
    """Decode one turn to its end (see `TurnDecoding`). Returns the new ids (end of text
    excluded) and the finish reason."""
    turn = TurnDecoding(logits, position, params, max_positions, tokenizer)
    while turn.finish is None:
        token = turn.choose()
        if token is not None and on_token is not None:
            on_token(token)
        if turn.finish is None:
            turn.fed(decoder.feed(*turn.feed()))
    return turn.ids, turn.finish
