"""A compact forward pass for every registered model family, with a layer-by-layer API.

Reuse needs per-layer control: compute any subset of tokens at a layer, against K/V the caller
supplies, at arbitrary position ids. Shapes: T = tokens computed now, S = context tokens
attended over, D = hidden size, H/Hkv = query/KV heads, Dh = head dim.

    hidden (T, D) [* embed_scale]                                       [embed]
    hidden --rmsnorm--> q (T, H, Dh), k/v (T, Hkv, Dh) [--q/k norm--] --rotary(l)--> [project]
    q attends over context K/V (S, Hkv, Dh): causal, [sliding window W]  [attend]
    hidden += [norm](o_proj(attn)); hidden += [norm](mlp(rmsnorm(hidden)))  [finish]
    logits = lm_head(rmsnorm(hidden)) [soft-capped]                     [logits]

The bracketed steps are what a family's `Structure` (model/families/) switches on; Llama runs
none of them. `attention.AttentionSpec` says per layer which window and rotary apply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.model.attention import GLOBAL_ROTARY, AttentionSpec, LayerAttention, attention
from agentcache.model.config import ModelConfig
from agentcache.model.families.base import (
    NORM_ROLES,
    ModelFamily,
    Structure,
    require,
    require_strategy,
)
from agentcache.model.rope import LayerRotary, RotaryEmbedding

__all__ = ["QKV", "ForwardOutput", "LayerWeights", "LlamaForward", "ModelWeights", "attention",
           "rms_norm"]  # fmt: skip

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


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
    q_norm: Tensor | None = None  # (Dh,) per-head norm of q before RoPE (Qwen3, Gemma 3)
    k_norm: Tensor | None = None  # (Dh,)
    attn_out_norm: Tensor | None = None  # (D,) norm of the attention output (Gemma 3)
    ff_out_norm: Tensor | None = None  # (D,) norm of the MLP output (Gemma 3)


@dataclass(frozen=True)
class ModelWeights:
    embed: Tensor  # (V, D)
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # (D,)
    lm_head: Tensor  # (V, D)

    @classmethod
    def from_state_dict(
        cls,
        sd: dict[str, Tensor],
        config: ModelConfig,
        family: ModelFamily | None = None,
        norm_offset: float = 0.0,
    ) -> ModelWeights:
        """Weights in fp32 from a checkpoint's tensors named as `family` (default: Llama)
        declares; `norm_offset` is folded into every RMSNorm weight (Gemma's 1 + w)."""
        from agentcache.model.families.llama import LlamaFamily

        fam = family or LlamaFamily()

        def get(name: str) -> Tensor:
            return sd[name].to(torch.float32).contiguous()

        def norm(w: Tensor) -> Tensor:
            return w + norm_offset if norm_offset else w

        layers = []
        for i in range(config.num_layers):
            tensors: dict[str, Any] = fam.layer_tensors(sd, i, config)
            for role in NORM_ROLES & tensors.keys():
                tensors[role] = norm(tensors[role])
            layers.append(LayerWeights(**tensors))
        embed = get("model.embed_tokens.weight")
        lm_head = embed if "lm_head.weight" not in sd else get("lm_head.weight")
        return cls(embed, tuple(layers), norm(get("model.norm.weight")), lm_head)


class QKV(NamedTuple):
    q: Tensor  # (T, H, Dh), rotated
    k: Tensor  # (T, Hkv, Dh), rotated
    v: Tensor  # (T, Hkv, Dh)


class LlamaForward:
    """Stateless forward: every method reads weights and its arguments, mutates nothing.

    `rope` rotates the layers whose `LayerAttention.rotary` is "global"; `rotaries` holds any
    other kind a family uses (Gemma 3's "local"). Without `structure`, the model is Llama."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        rope: RotaryEmbedding,
        structure: Structure | None = None,
        rotaries: Mapping[str, RotaryEmbedding] | None = None,
        family: ModelFamily | None = None,
    ) -> None:
        from agentcache.model.families.llama import LlamaFamily

        self.config = config
        self.family: ModelFamily = family or LlamaFamily()
        self.weights = weights
        self.rope = rope
        self.structure = structure or _llama_structure(config)
        self.spec = self.structure.attention
        self.scale = self.spec.scale
        kinds = {**(rotaries or {}), GLOBAL_ROTARY: rope}
        self.rotary = LayerRotary([None if r is None else kinds[r] for r in self.spec.rotaries])
        s = self.structure
        self._embed_scale = None if s.embed_scale is None else torch.tensor(s.embed_scale)
        self._act = ACTIVATIONS[s.activation]

    def embed(self, ids: Tensor) -> Tensor:
        """(T,) token ids -> (T, D) hidden states."""
        hidden = self.weights.embed[ids]
        if self._embed_scale is not None:  # Gemma: sqrt(D), as an fp32 scalar
            hidden = hidden * self._embed_scale.to(hidden.dtype)
        return hidden

    def project(self, layer: int, hidden: Tensor, positions: Tensor) -> QKV:
        """Q/K/V of `hidden` (T, D) at `positions` (T,), RoPE applied to q and k (not on a
        NoPE layer)."""
        w = self.weights.layers[layer]
        c = self.config
        x = rms_norm(hidden, w.input_norm, c.rms_norm_eps)
        q = self.linear(layer, "q", x, w.wq, w.bq).view(-1, c.num_heads, c.head_dim)
        k = self.linear(layer, "k", x, w.wk, w.bk).view(-1, c.num_kv_heads, c.head_dim)
        v = self.linear(layer, "v", x, w.wv, w.bv).view(-1, c.num_kv_heads, c.head_dim)
        if w.q_norm is not None and w.k_norm is not None:  # per head, before RoPE
            q = rms_norm(q, w.q_norm, c.rms_norm_eps)
            k = rms_norm(k, w.k_norm, c.rms_norm_eps)
        rope = self.rotary.layers[layer]
        if rope is None:
            return QKV(q, k, v)
        q, k = rope.apply_qk(q, k, positions)  # one cos/sin lookup for both
        return QKV(q, k, v)

    def linear(
        self, layer: int, target: str, x: Tensor, weight: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        """Attention projection `target` (q, k, v or o) of `layer`; variants add adapters here."""
        return F.linear(x, weight, bias)

    def limits(self) -> dict[str, str]:
        """Features this model cannot serve yet -> why (`families.base.FEATURES`)."""
        return self.family.limits(self.structure)

    def require(self, feature: str) -> None:
        """Raise `ConfigError` naming the family and `feature` if it cannot serve it."""
        require(self.family, self.limits(), feature, self.config.model_type)

    def require_strategy(self, strategy: str) -> None:
        """Raise `ConfigError` if reuse strategy `strategy` cannot run exactly on this model."""
        require_strategy(self.family, self.limits(), strategy, self.config.model_type)

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

        `query_index` (T,) holds each query's index in the context: it sees keys 0..index
        (on a sliding-window layer, only the last W of them). None means the queries are the
        last T context tokens in order (plain causal). Returns the layer's output (T, D).
        """
        window = self.spec.layers[layer].window
        attn = attention(q, keys, values, query_index, self.scale, window)  # (T, H*Dh)
        return self.finish(layer, hidden, attn)

    def finish(self, layer: int, hidden: Tensor, attn: Tensor) -> Tensor:
        """Output projection and MLP of `layer` given its attention output `attn` (T, H*Dh)."""
        w = self.weights.layers[layer]
        eps = self.config.rms_norm_eps
        out = self.linear(layer, "o", attn, w.wo)
        if w.attn_out_norm is not None:
            out = rms_norm(out, w.attn_out_norm, eps)
        hidden = hidden + out
        x = rms_norm(hidden, w.post_norm, eps)
        mlp = F.linear(self._act(F.linear(x, w.w_gate)) * F.linear(x, w.w_up), w.w_down)
        if w.ff_out_norm is not None:
            mlp = rms_norm(mlp, w.ff_out_norm, eps)
        return hidden + mlp

    def logits(self, hidden: Tensor) -> Tensor:
        """(T, D) last-layer hidden -> (T, V) logits."""
        x = rms_norm(hidden, self.weights.final_norm, self.config.rms_norm_eps)
        logits = F.linear(x, self.weights.lm_head)
        cap = self.structure.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

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


def _llama_structure(config: ModelConfig) -> Structure:
    """Llama's structure from our config alone (forwards built without a family)."""
    layers = tuple(LayerAttention() for _ in range(config.num_layers))
    spec = AttentionSpec(scale=config.head_dim**-0.5, layers=layers)
    return Structure(attention=spec, rotaries={GLOBAL_ROTARY: dict(config.rope_parameters)})


class ForwardOutput(NamedTuple):
    logits: Tensor  # (T, V)
    keys: Tensor  # (L, T, Hkv, Dh)
    values: Tensor  # (L, T, Hkv, Dh)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)
