"""The decode loop: one loop for every decode policy, over the `Decoder` seam.

    logits (prefill) -> sample -> token -> end of text?  stop  (not emitted)
                                        -> emit: ids, on_token (may raise, e.g. cancelled)
                                        -> stop string?  stop
                                        -> max_new_tokens?  length
                                        -> decoder.feed -> logits | chosen token | full: length

The decoder is chosen by the engine (`DecodeSetup.decoder`); nothing here depends on which.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentcache.decode.base import Decoder
from agentcache.model.tokenizer import TextTokenizer
from agentcache.runtime.params import GenerationParams
from agentcache.runtime.sampling import constrain, sample
from agentcache.runtime.stops import StopMatcher


def decode_loop(
    decoder: Decoder,
    logits: Tensor,
    position: int,
    params: GenerationParams,
    max_positions: int,
    tokenizer: TextTokenizer,
    on_token: Callable[[int], None] | None = None,
) -> tuple[list[int], str]:
    """Decode after a prefill whose last logits are `logits` (V,), the first new token going at
    `position`. Returns the new ids (end of text excluded) and the finish reason: "stop" (end
    of text or a stop string) or "length" (max_new_tokens, the model's positions, or a decoder
    that holds no more)."""
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    eos = tokenizer.eos_token_ids
    stops = StopMatcher(tokenizer.decode, params.stop) if params.stop else None
    ids: list[int] = []
    after: Tensor | int = logits
    while len(ids) < params.max_new_tokens and position < max_positions:
        if isinstance(after, int):
            token = after
        else:
            logits = constrain(after, params.constraint, ids)  # structured outputs
            token = sample(logits, params.temperature, params.top_p, gen)
        if token in eos:
            return ids, "stop"
        ids.append(token)
        if on_token is not None:
            on_token(token)
        if stops is not None and stops.feed(token):
            return ids, "stop"
        if len(ids) == params.max_new_tokens:
            break
        room = min(params.max_new_tokens - len(ids), max_positions - position - 1)
        fed = decoder.feed(token, position, room)
        if fed is None:
            break
        after, position = fed, position + 1
    return ids, "length"
