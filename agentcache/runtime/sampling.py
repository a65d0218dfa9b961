"""Next-token choice: greedy at temperature 0, else temperature + top-p sampling; a
constraint (structured outputs) masks the logits first."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentcache.runtime.params import TokenConstraint


def constrain(logits: Tensor, constraint: TokenConstraint | None, ids: Sequence[int]) -> Tensor:
    """logits (V,) with the tokens `constraint` forbids after the reply's `ids` at -inf (a new
    tensor; `logits` is not changed). None: `logits` as they are."""
    if constraint is None:
        return logits
    allowed = constraint.allowed(ids, logits)
    return logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))


def sample(logits: Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    """logits (V,) -> token id."""
    if temperature <= 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen).item())
