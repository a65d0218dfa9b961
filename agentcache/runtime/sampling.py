"""Next-token choice: greedy at temperature 0, else temperature + top-p sampling."""

from __future__ import annotations

import torch
from torch import Tensor


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
