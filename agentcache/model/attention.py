"""The attention spec: what every layer's attention is, read by prefill, decode and rankers.

A family declares, per layer, whether queries see every earlier key (global) or only the last W
(a sliding window), and which rotary rotates its q/k (none: a NoPE layer). The spec holds those
with the softmax scale, so the forward, the paged decoders and the reuse rankers compute the
same attention from one declaration instead of each reading the model's config.

Sliding window W (transformers' `sliding_window_overlay`): query i sees keys j with

    i - W < j <= i            (its own key and the W - 1 before it)

counted in context indices, not positions: with position plans that leave gaps the window is
still the last W tokens of the sequence, as in the model's own cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.model.run_attention import blocked_attention, runs_attention

GLOBAL_ROTARY = "global"  # the rotary of full-attention layers; Gemma 3 adds "local"


@dataclass(frozen=True)
class LayerAttention:
    window: int | None = None  # sliding window W; None: global
    rotary: str | None = GLOBAL_ROTARY  # key into the model's rotaries; None: NoPE (no rotation)

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be >= 1 token, got {self.window}")


@dataclass(frozen=True)
class AttentionSpec:
    scale: float  # softmax scale: head_dim ** -0.5, or query_pre_attn_scalar ** -0.5 (Gemma 3)
    layers: tuple[LayerAttention, ...]

    def window(self, layer: int) -> int | None:
        return self.layers[layer].window

    @property
    def windowed(self) -> bool:
        """Whether any layer attends through a sliding window."""
        return any(la.window is not None for la in self.layers)

    @property
    def rotaries(self) -> tuple[str | None, ...]:
        return tuple(la.rotary for la in self.layers)


def causal_mask(
    query_index: Tensor, s: int, window: int | None, key_index: Tensor | None = None
) -> Tensor:
    """(T, S) bool: query t sees key j iff j <= query_index[t] (and, windowed, j > index - W).

    `key_index` (S,): the keys' own indices when they are a subset of the context (a probe
    over some tokens): both sides are then counted in context indices, not rows."""
    keys = (torch.arange(s) if key_index is None else key_index)[None, :]
    mask = keys <= query_index[:, None]
    if window is not None:
        mask &= keys > query_index[:, None] - window
    return mask


def attention(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    query_index: Tensor | None,
    scale: float,
    window: int | None = None,
) -> Tensor:
    """Grouped-query attention. q (T, H, Dh), keys/values (S, Hkv, Dh) -> (T, H*Dh).

    `query_index` (T,) is each query's index in the context, strictly increasing; None: the
    last T in order. A global layer whose queries are not the whole context takes the
    run-split path (model/run_attention.py: causal cost, not every (T, S) pair); a windowed
    one the masked reference."""
    t, s = q.shape[0], keys.shape[0]
    if query_index is None and t == s and (window is None or window >= s):
        return _sdpa(q, keys, values, None, scale)
    if query_index is None:
        query_index = torch.arange(s - t, s)
    if window is not None:
        return _sdpa(q, keys, values, causal_mask(query_index, s, window), scale)
    fast = runs_attention(q, keys, values, query_index, scale)  # few query runs: causal
    return fast if fast is not None else blocked_attention(q, keys, values, query_index, scale)


def attention_probs(
    q: Tensor, keys: Tensor, query_index: Tensor, scale: float, window: int | None = None
) -> Tensor:
    """The attention weights themselves, for callers that read them (the head profiler's page
    mass): (T, H, S) softmax of q . k * `scale` under `causal_mask` (the window included).
    q (T, H, Dh), keys (S, Hkv, Dh); query head h reads KV head h // (H / Hkv). The reference
    computation: `probs_attention(attention_probs(...), values)` equals `attention`."""
    t, h, _ = q.shape
    s, hkv = keys.shape[0], keys.shape[1]
    qg = q.view(t, hkv, h // hkv, -1).transpose(0, 1)  # (Hkv, T, G, Dh)
    scores = torch.einsum("ktgd,skd->ktgs", qg, keys) * scale
    mask = causal_mask(query_index, s, window)  # (T, S)
    scores = scores.masked_fill(~mask[None, :, None, :], float("-inf"))
    return torch.softmax(scores, -1).transpose(0, 1).reshape(t, h, s)


def probs_attention(probs: Tensor, values: Tensor) -> Tensor:
    """Attention output (T, H*Dh) of weights `probs` (T, H, S) over `values` (S, Hkv, Dh)."""
    t, h, s = probs.shape
    hkv = values.shape[1]
    pg = probs.view(t, hkv, h // hkv, s)
    return torch.einsum("tkgs,skd->tkgd", pg, values).reshape(t, -1)


def masked_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Grouped-query attention under an explicit (T, S) bool `mask` (from `causal_mask`, for
    a context that is a subset of the sequence). q (T, H, Dh), keys/values (S, Hkv, Dh)."""
    return _sdpa(q, keys, values, mask, scale)


def _sdpa(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """One SDPA call: causal without `mask`, else under the (T, S) bool `mask`."""
    t = q.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
    kh = keys.transpose(0, 1).unsqueeze(0)  # (1, Hkv, S, Dh)
    vh = values.transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1).reshape(t, -1)
