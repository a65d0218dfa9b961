"""Attention probabilities of a few queries over every prompt key: what attention rankers read."""

from __future__ import annotations

import torch
from torch import Tensor


def attention_probs(q: Tensor, q_idx: Tensor, keys: Tensor, scale: float) -> Tensor:
    """Causal attention probabilities of queries (W, H, Dh) at prompt indices `q_idx` (W,)
    over keys (T, Hkv, Dh). -> (H, W, T)

    One batched matmul per KV head with the causal mask folded in as its additive term: no
    copy of the keys per query head and no separate masking pass (the probe scores up to
    256 queries against every prompt key on each probe layer, so this is on the TTFT path).
    `attention_probs_reference` is the plain formulation it is tested against."""
    w, h, d = q.shape
    t, hkv = keys.shape[0], keys.shape[1]
    group = h // hkv
    q_g = q.reshape(w, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * w, d)
    bias = torch.zeros(w, t, dtype=q.dtype)
    bias.masked_fill_(torch.arange(t)[None, :] > q_idx[:, None], float("-inf"))
    scores = torch.baddbmm(
        bias.repeat(group, 1).expand(hkv, group * w, t), q_g, keys.permute(1, 2, 0), alpha=scale
    )
    return torch.softmax(scores, dim=-1).reshape(h, w, t)


def attention_probs_reference(q: Tensor, q_idx: Tensor, keys: Tensor, scale: float) -> Tensor:
    """`attention_probs` written plainly: GQA groups expanded, scores masked, softmax."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)  # (T, H, Dh)
    scores = torch.einsum("whd,thd->hwt", q, k) * scale
    mask = torch.arange(keys.shape[0])[None, :] <= q_idx[:, None]  # (W, T)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def attention_received(q: Tensor, q_idx: Tensor, keys: Tensor, scale: float) -> Tensor:
    """Attention the queries at `q_idx` pay each key: mean over heads, max over queries. (T,)"""
    return attention_probs(q, q_idx, keys, scale).mean(dim=0).max(dim=0).values
