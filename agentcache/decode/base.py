"""The decode seam: what the engine's decode loop asks of a decoder after prefill.

The loop samples a token from the prefill's logits, then, token by token:

    next = decoder.feed(token, position, room)
      logits (V,)  -> the loop samples the next token from them
      int          -> the next token, already chosen (greedy verified decoding)
      None         -> the decoder holds no more tokens: the turn ends as at the last position

Implementations: `dense.DenseDecoder` (the engine's page pool), `decoder.SparseDecoder`
(per-head top-K pages), `verified.VerifiedDecoder` (sparse drafts, dense verification).

A decoder whose step is the model's layers with its own attention may also be fed inside a
batched step (`runtime/batch_step.py`): `begin_step` does what its step does before the layers
and returns a `StepRow`, the row's attention per layer; the caller runs the embedding,
projections, MLPs and logits, for this row alone (`row_step`) or beside other rows:

    row = decoder.begin_step(forward, token, position, room)   # before the layers
    for each layer l:  q, k, v = project(l, rows)  ->  attn[row] = row.attend(l, q, k, v)
                       hidden = finish(l, hidden, attn)
    row.end()                                                  # after the layers
    row.take(logits[rows of row])  # what `feed` returns, or the decoder's next row, begun

A decoder may need several steps before it answers a token (verified decoding drafts tokens
sparsely, one row per step, then verifies them): its row's `take` then returns the row it
runs next, already begun, and the turn is fed nothing until a later `take` answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from agentcache.decode.stats import DecodeStats
from agentcache.model.llama import LlamaForward


class StepRow(ABC):
    """One sequence's part of a decode step whose embedding, projections, norms, MLPs and
    logits the caller runs: `tokens` at `positions` (one token for a decode row; a verified
    decoder's dense pass has several), the decoder's work before the layers done.

    Contract: the caller calls `attend` once per layer, in layer order, with the row's own
    q (n, H, Dh), k and v (n, Hkv, Dh) of that layer, n = `width`; it writes k/v to the
    sequence's KV, does the decoder's per-layer work (selection, bookkeeping) and returns the
    attention output (n, H*Dh), a tensor owned by the caller, that depends on nothing but q,
    k, v and the sequence's state. Then `end` once, after the last layer, and `take` with the
    logits after each of its tokens."""

    def __init__(self, tokens: int | Sequence[int], positions: int | Sequence[int]) -> None:
        # what its attention is, for the step's time by kind (`runtime.batch_step.StepTimes`):
        # "dense" (its sequence's whole context), "sparse" (selected pages), "verify" (a
        # verified decoder's dense pass)
        self.kind = "dense"
        self.tokens = [tokens] if isinstance(tokens, int) else list(tokens)
        self.positions = [positions] if isinstance(positions, int) else list(positions)
        n, m = len(self.tokens), len(self.positions)
        if not n or n != m:
            raise ValueError(f"a step row needs one position per token, got {n} and {m}")

    @property
    def width(self) -> int:
        """Its tokens: rows of the step's matrix products."""
        return len(self.tokens)

    @abstractmethod
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q (n, H, Dh), k/v (n, Hkv, Dh) -> (n, H*Dh)."""

    @abstractmethod
    def end(self) -> None:
        """After the last layer."""

    def take(self, logits: Tensor) -> Tensor | int | StepRow | None:
        """After `end`, the logits after each of its tokens (n, V): what its decoder's `feed`
        would return (by default the logits after its last token, (V,)); or, when the decoder
        needs more steps before it answers, its next row, begun, which the caller runs (to
        its `end`, then `take`) in a later step, feeding the turn nothing meanwhile."""
        return logits[-1]


class Decoder(ABC):
    """One sequence's decode state after prefill.

    Contract: `feed` appends `token` at `position` to the sequence's KV (or finds it there: a
    verified decoder's chosen tokens already are) and returns the logits after it (V,, owned by
    the caller), the next token when the decoder chose it, or None when it holds no more tokens
    (nothing appended then). `room` (>= 0) is how many tokens the turn may still take after
    `token`; a decoder may prepare up to that many ahead. `stats` reads the figures so far, None
    for a decoder that keeps none.

    `begin_step` is optional: None (the default, nothing done) when the decoder is fed only by
    `feed` (for this token: a verified decoder answers from tokens it verified already), or
    when `forward` is not the one it steps with; else it begins feeding `token` at `position`
    (as `feed` would, with the same `room`) and returns the rest as a `StepRow`, which the
    caller must run to its `end` and `take`. It raises what `feed` raises before the layers."""

    @abstractmethod
    def feed(self, token: int, position: int, room: int) -> Tensor | int | None:
        """Append `token` at `position`; what comes after it (see the class contract)."""

    def begin_step(
        self, forward: LlamaForward, token: int, position: int, room: int
    ) -> StepRow | None:
        return None

    def stats(self) -> DecodeStats | None:
        return None

    def queued(self) -> int:
        """How many of the next `feed`s it answers with no model work (a verified decoder's
        tokens verified already); the scheduler feeds those in the step that verified them."""
        return 0


def row_logits(forward: LlamaForward, row: StepRow) -> Tensor:
    """`row` run alone through `forward`, its tokens the matrix products' rows: the logits
    after each of its tokens (n, V)."""
    f = forward
    pos = torch.tensor(row.positions)
    hidden = f.embed(torch.tensor(row.tokens))
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, pos)
        hidden = f.finish(layer, hidden, row.attend(layer, q, k, v))
    row.end()
    return f.logits(hidden)


def row_step(forward: LlamaForward, row: StepRow) -> Tensor:
    """A one-token `row` run alone: its logits (V,). A decoder's own step (`dense.dense_step`'s,
    a sparse decoder's)."""
    return row_logits(forward, row)[-1]
