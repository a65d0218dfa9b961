"""Attention probabilities of a few queries over every prompt key: what attention rankers read.

The mask is the model's own (`model.attention.causal_mask`): causal, and on a sliding-window
layer only the last W keys of each query, so a ranker sees the attention the layer computes."""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.model.attention import causal_mask


def attention_probs(
    q: Tensor, q_idx: Tensor, keys: Tensor, scale: float, window: int | None = None,
    key_index: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Attention probabilities of queries (W, H, Dh) at prompt indices `q_idx` (W,) over keys
    (T, Hkv, Dh), under the layer's mask (`window`: its sliding window; `key_index` (T,): the
    keys' prompt indices when they are not 0..T-1). -> (H, W, T)

    One batched matmul per KV head with the mask folded in as its additive term: no copy of
    the keys per query head and no separate masking pass (the probe scores up to 256 queries
    against every prompt key on each probe layer, so this is on the TTFT path).
    `attention_probs_reference` is the plain formulation it is tested against."""
    w, h, d = q.shape
    t, hkv = keys.shape[0], keys.shape[1]
    group = h // hkv
    q_g = q.reshape(w, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * w, d)
    bias = torch.zeros(w, t, dtype=q.dtype)
    bias.masked_fill_(~causal_mask(q_idx, t, window, key_index), float("-inf"))
    scores = torch.baddbmm(
        bias.repeat(group, 1).expand(hkv, group * w, t), q_g, keys.permute(1, 2, 0), alpha=scale
    )
    return torch.softmax(scores, dim=-1).reshape(h, w, t)


def attention_probs_reference(
    q: Tensor, q_idx: Tensor, keys: Tensor, scale: float, window: int | None = None
) -> Tensor:
    """`attention_probs` written plainly: GQA groups expanded, scores masked, softmax."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)  # (T, H, Dh)
    scores = torch.einsum("whd,thd->hwt", q, k) * scale
    j, i = torch.arange(keys.shape[0])[None, :], q_idx[:, None]
    mask = (j <= i) if window is None else (j <= i) & (j > i - window)  # (W, T)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def attention_received(
    q: Tensor, q_idx: Tensor, keys: Tensor, scale: float, window: int | None = None,
    key_index: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Attention the queries at `q_idx` pay each key: mean over heads, max over queries. (T,)"""
    probs = attention_probs(q, q_idx, keys, scale, window, key_index)
    return probs.mean(dim=0).max(dim=0).values
