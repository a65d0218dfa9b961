"""The planner's model-read signal: where the prompt's last tokens look, in a fresh pass of
the whole prompt through the first layers (no cached KV, no store access).

    tokens  : [ 0 .................................................. T-W ...... T-1 ]
    layers  : [0, P-1) every token computed (hidden states for the next layer)
    layer   : P-1      keys of every token, queries of the last W (the window)
    read    : per layer l < P, per token i: the attention the window pays i, averaged over
              heads; `mass` averages over the window's queries, `peak` takes their max

Layer 0's keys depend on a token and its position alone, so `layers=1` costs projections
only (no attention output, no MLP); each further layer costs one layer of a full prefill.
A plan's signal is the mass its left-out tokens receive (`left_mass`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from agentcache.model.attention import AttentionSpec
from agentcache.model.llama import QKV
from agentcache.reuse.ranking.probs import attention_probs


class LayerForward(Protocol):
    """What the read uses of a forward (`LlamaForward`, `TimedForward`)."""

    spec: AttentionSpec
    scale: float

    def embed(self, ids: Tensor) -> Tensor: ...
    def project(self, layer: int, hidden: Tensor, positions: Tensor) -> QKV: ...
    def attend(
        self, layer: int, hidden: Tensor, q: Tensor, keys: Tensor, values: Tensor,
        query_index: Tensor | None,
    ) -> Tensor: ...  # fmt: skip


@dataclass(frozen=True)
class AttentionRead:
    mass: Tensor  # (P, T) mean over window queries and heads of the attention paid each token
    peak: Tensor  # (P, T) max over window queries of the head-mean (rpdc's probe score)
    keys: Tensor | None = None  # (P, T, Hkv, Dh) keys before RoPE, when asked for

    def left_mass(self, left: Tensor, layer: int) -> float:
        """The window's mean attention mass on the (T,) bool mask `left` at `layer`."""
        return float(self.mass[layer][left].sum())


def read_attention(
    f: LayerForward, ids: Tensor, layers: int, window: int, keys: bool = False
) -> AttentionRead:
    """`ids` (T,) at positions 0..T-1 through layers [0, `layers`); the window is the last
    `window` tokens (all of them when the prompt is shorter). With `keys`, every layer's
    keys before RoPE too (a stored copy's, re-rotated to any position, compares to them)."""
    if layers < 1 or window < 1:
        raise ValueError(f"layers and window must be >= 1, got {layers}, {window}")
    t = ids.shape[0]
    positions = torch.arange(t)
    w_idx = positions[-window:]
    mass, peak = torch.zeros(layers, t), torch.zeros(layers, t)
    hidden = f.embed(ids)
    plain = []
    for layer in range(layers):
        qkv = f.project(layer, hidden, positions)
        if keys:  # RoPE at position 0 is the identity
            plain.append(f.project(layer, hidden, torch.zeros_like(positions)).k)
        probs = attention_probs(qkv.q[w_idx], w_idx, qkv.k, f.scale, f.spec.window(layer))
        per_query = probs.mean(dim=0)  # (W, T)
        mass[layer], peak[layer] = per_query.mean(dim=0), per_query.max(dim=0).values
        if layer + 1 < layers:
            hidden = f.attend(layer, hidden, qkv.q, qkv.k, qkv.v, None)
    return AttentionRead(mass, peak, torch.stack(plain) if keys else None)
