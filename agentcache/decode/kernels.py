"""The sparse decoder's tensor kernels: top-p page selection, page attention batched over KV
heads, and the verify pass's attention of the last few tokens over one head's whole KV."""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.model.llama import attention

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # returns (out, lse)


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


def last_tokens_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Causal attention of the last n tokens over one KV head's S keys, each seeing the keys up
    to its own: q (n, G, Dh), k/v (S, Dh) -> (n, G*Dh).

    The S - n keys before them are read once, unmasked, for all n*G queries (the flash kernel,
    no mask built over S); the last n keys causally; the two parts merged by log-sum-exp.
    `model.llama.attention` with its (n, S) mask is the reference it is tested against."""
    n, g, dh = q.shape
    s = k.shape[0]
    if s == n:  # nothing before them
        return attention(q, k[:, None], v[:, None], None, scale)
    rows = q.permute(1, 0, 2).reshape(1, 1, g * n, dh)  # (1, 1, G*n, Dh), query head-major
    before_k = k[: s - n].reshape(1, 1, s - n, dh)
    before_v = v[: s - n].reshape(1, 1, s - n, dh)
    out_p, lse_p = _flash(rows, before_k, before_v, 0.0, False, attn_mask=None, scale=scale)
    tail_k = k[s - n :].expand(1, g, n, dh)  # the last n keys, for each of the G query heads
    tail_v = v[s - n :].expand(1, g, n, dh)
    out_t, lse_t = _flash(q.permute(1, 0, 2).unsqueeze(0), tail_k.contiguous(), tail_v.contiguous(),
                          0.0, True, attn_mask=None, scale=scale)  # fmt: skip
    lse = torch.stack([lse_p.view(g, n), lse_t.view(g, n)])  # (2, G, n)
    w = torch.softmax(lse, dim=0).unsqueeze(-1)  # each part's share of the softmax mass
    out = out_p.view(g, n, dh) * w[0] + out_t.view(g, n, dh) * w[1]  # (G, n, Dh)
    return out.permute(1, 0, 2).reshape(n, g * dh)
