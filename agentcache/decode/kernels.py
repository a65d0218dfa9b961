"""The sparse decoder's tensor kernels: top-p page selection and page attention batched over
KV heads."""

from __future__ import annotations

import torch
from torch import Tensor


def top_p_pages(scores: Tensor, k: int, p: float, scale: float) -> Tensor:
    """The top-k pages by score bound (n, k), -1 past the fewest whose share of the softmax
    over every page's bound (`scores` (n, P) * `scale`) reaches `p`; p = 1 keeps all k."""
    top = scores.topk(k, dim=1)
    if p >= 1.0:
        return top.indices
    mass = torch.softmax(scores * scale, dim=1).gather(1, top.indices)  # (n, k), descending
    before = mass.cumsum(1) - mass  # mass of the pages ranked above
    return top.indices.masked_fill(before >= p, -1)


def page_attention(qg: Tensor, k: Tensor, v: Tensor, valid: Tensor, scale: float) -> Tensor:
    """Decode attention of one token, batched over KV heads.

    qg (Hkv, G, Dh); k/v (Hkv, S, Dh); valid (Hkv, S) -> (H*Dh) in query-head order."""
    scores = (qg @ k.transpose(1, 2)) * scale  # (Hkv, G, S)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return (probs @ v).reshape(1, -1)
