"""A compact Llama-family forward pass (Llama, Qwen2, Mistral) with a layer-by-layer API.

Reuse needs per-layer control: compute any subset of tokens at a layer, against K/V the caller
supplies, at arbitrary position ids. Shapes: T = tokens computed now, S = context tokens
attended over, D = hidden size, H/Hkv = query/KV heads, Dh = head dim.

    hidden (T, D) --rmsnorm--> q (T, H, Dh), k/v (T, Hkv, Dh)   [project]
    q attends causally over context K/V (S, Hkv, Dh)           [attend]
    hidden += o_proj(attn); hidden += mlp(rmsnorm(hidden))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.model.config import ModelConfig
from agentcache.model.rope import RotaryEmbedding
from agentcache.model.run_attention import blocked_attention, runs_attention


@dataclass(frozen=True)
class LayerWeights:
    input_norm: Tensor  # (D,)
    wq: Tensor  # (H*Dh, D)
    wk: Tensor  # (Hkv*Dh, D)
    wv: Tensor  # (Hkv*Dh, D)
    wo: Tensor  # (D, H*Dh)
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    post_norm: Tensor  # (D,)
    w_gate: Tensor  # (I, D)
    w_up: Tensor  # (I, D)
    w_down: Tensor  # (D, I)


@dataclass(frozen=True)
class ModelWeights:
    embed: Tensor  # (V, D)
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # (D,)
    lm_head: Tensor  # (V, D)

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor], config: ModelConfig) -> ModelWeights:
        def get(name: str) -> Tensor:
            return sd[name].to(torch.float32).contiguous()

        def maybe(name: str) -> Tensor | None:
            return get(name) if name in sd else None

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            layers.append(
                LayerWeights(
                    input_norm=get(p + "input_layernorm.weight"),
                    wq=get(p + "self_attn.q_proj.weight"),
                    wk=get(p + "self_attn.k_proj.weight"),
                    wv=get(p + "self_attn.v_proj.weight"),
                    wo=get(p + "self_attn.o_proj.weight"),
                    bq=maybe(p + "self_attn.q_proj.bias"),
                    bk=maybe(p + "self_attn.k_proj.bias"),
                    bv=maybe(p + "self_attn.v_proj.bias"),
                    post_norm=get(p + "post_attention_layernorm.weight"),
                    w_gate=get(p + "mlp.gate_proj.weight"),
                    w_up=get(p + "mlp.up_proj.weight"),
                    w_down=get(p + "mlp.down_proj.weight"),
                )
            )
        embed = get("model.embed_tokens.weight")
        lm_head = embed if "lm_head.weight" not in sd else get("lm_head.weight")
        return cls(embed, tuple(layers), get("model.norm.weight"), lm_head)


class QKV(NamedTuple):
    q: Tensor  # (T, H, Dh), rotated
    k: Tensor  # (T, Hkv, Dh), rotated
    v: Tensor  # (T, Hkv, Dh)


class LlamaForward:
    """Stateless forward: every method reads weights and its arguments, mutates nothing."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, rope: RotaryEmbedding) -> None:
        self.config = config
        self.weights = weights
        self.rope = rope
        self.scale = config.head_dim**-0.5

    def embed(self, ids: Tensor) -> Tensor:
        """(T,) token ids -> (T, D) hidden states."""
        return self.weights.embed[ids]

    def project(self, layer: int, hidden: Tensor, positions: Tensor) -> QKV:
        """Q/K/V of `hidden` (T, D) at `positions` (T,), RoPE applied to q and k."""
        w = self.weights.layers[layer]
        c = self.config
        x = rms_norm(hidden, w.input_norm, c.rms_norm_eps)
        q = self.linear(layer, "q", x, w.wq, w.bq).view(-1, c.num_heads, c.head_dim)
        k = self.linear(layer, "k", x, w.wk, w.bk).view(-1, c.num_kv_heads, c.head_dim)
        v = self.linear(layer, "v", x, w.wv, w.bv).view(-1, c.num_kv_heads, c.head_dim)
        return QKV(self.rope.apply(q, positions), self.rope.apply(k, positions), v)

    def linear(
        self, layer: int, target: str, x: Tensor, weight: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """Attention projection `target` (q, k, v or o) of `layer`; variants add adapters here."""
        return F.linear(x, weight, bias)

    def attend(
        self,
        layer: int,
        hidden: Tensor,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        query_index: Tensor | None,
    ) -> Tensor:
        """Finish `layer` for the T tokens in `hidden` given context K/V (S, Hkv, Dh).

        `query_index` (T,) holds each query's index in the context: it sees keys 0..index.
        None means the queries are the last T context tokens in order (plain causal).
        Returns the layer's output hidden states (T, D).
        """
        attn = attention(q, keys, values, query_index, self.scale)  # (T, H*Dh)
        return self.finish(layer, hidden, attn)

    def finish(self, layer: int, hidden: Tensor, attn: Tensor) -> Tensor:
        """Output projection and MLP of `layer` given its attention output `attn` (T, H*Dh)."""
        w = self.weights.layers[layer]
        hidden = hidden + self.linear(layer, "o", attn, w.wo)
        x = rms_norm(hidden, w.post_norm, self.config.rms_norm_eps)
        return hidden + F.linear(F.silu(F.linear(x, w.w_gate)) * F.linear(x, w.w_up), w.w_down)

    def logits(self, hidden: Tensor) -> Tensor:
        """(T, D) last-layer hidden -> (T, V) logits."""
        x = rms_norm(hidden, self.weights.final_norm, self.config.rms_norm_eps)
        return F.linear(x, self.weights.lm_head)

    def forward(self, ids: Tensor, positions: Tensor | None = None) -> ForwardOutput:
        """Reference dense forward of a whole sequence; returns logits and every layer's K/V."""
        if positions is None:
            positions = torch.arange(ids.shape[0])
        hidden = self.embed(ids)
        keys, values = [], []
        for layer in range(self.config.num_layers):
            q, k, v = self.project(layer, hidden, positions)
            hidden = self.attend(layer, hidden, q, k, v, None)
            keys.append(k)
            values.append(v)
        return ForwardOutput(self.logits(hidden), torch.stack(keys), torch.stack(values))


class ForwardOutput(NamedTuple):
    logits: Tensor  # (T, V)
    keys: Tensor  # (L, T, Hkv, Dh)
    values: Tensor  # (L, T, Hkv, Dh)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def attention(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor | None, scale: float
) -> Tensor:
    """Grouped-query attention. q (T, H, Dh), keys/values (S, Hkv, Dh) -> (T, H*Dh).
    `query_index` (T,) is strictly increasing (each query's index in the context)."""
    t, s = q.shape[0], keys.shape[0]
    if query_index is None and t == s:
        qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, Dh)
        kh = keys.transpose(0, 1).unsqueeze(0)  # (1, Hkv, S, Dh)
        vh = values.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
        )
        return out[0].transpose(0, 1).reshape(t, -1)
    if query_index is None:
        query_index = torch.arange(s - t, s)
    fast = runs_attention(q, keys, values, query_index, scale)  # few query runs: causal
    return fast if fast is not None else blocked_attention(q, keys, values, query_index, scale)
