"""Contextual position encoding (CoPE, Golovneva et al. 2024) as an attention variant, with LoRA
adapters on the attention projections; the backbone stays frozen.

For query i and key j <= i (causal), per head:

    g_ij  = sigmoid(q_i . k_j / sqrt(Dh))              gate: does token j count?
    p_ij  = min(P, sum_{t=j..i} g_it)                   contextual position (reverse cumsum)
    z_ij  = q_i . e[floor p_ij] * (1 - frac p_ij) + q_i . e[ceil p_ij] * frac p_ij
    a_ij  = softmax_j(q_i . k_j / sqrt(Dh) + z_ij)

Positions are counted by content, so a key carries no absolute position: the model keeps one
learned table e (P+1, Dh) per layer and KV head (the query heads of a GQA group share it, as they
share keys). q . e is computed once per query and table row, (T, P+1), then gathered at floor /
ceil of every p_ij and interpolated, instead of a (T, S, Dh) product.

RoPE. `CoPEConfig.keep_rope` chooses between CoPE on top of the rotated q/k (the model keeps
its RoPE; keys still carry their absolute positions, so a shifted segment drifts as under RoPE)
and CoPE replacing RoPE (q/k unrotated; `NoRotation` makes re-rotation of stored keys a no-op,
because there is nothing to rotate). docs/cope.md gives the measurements behind the default.

`CoPEForward` subclasses `LlamaForward`: the RoPE path is untouched, strategies see the same
project / attend / finish API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.model.llama import LlamaForward
from agentcache.model.rope import RotaryEmbedding

LORA_TARGETS = ("q", "k", "v", "o")
QUERY_BLOCK = 256  # queries per block: bounds the (H, T, S) gate tensors on long prompts


@dataclass(frozen=True)
class CoPEConfig:
    max_position: int = 64  # P: contextual positions are capped here; tables have P+1 rows
    keep_rope: bool = False  # CoPE on top of RoPE (True) or instead of it (False)
    rank: int = 8  # LoRA rank on q, k, v, o
    alpha: float = 16.0  # LoRA scale alpha / rank

    def __post_init__(self) -> None:
        if self.max_position < 1:
            raise ValueError(f"max_position must be >= 1, got {self.max_position}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")


@dataclass(frozen=True)
class LayerAdapter:
    """One layer's trainable tensors. LoRA: W x + (alpha/r) B A x, B starts at zero."""

    lora_a: dict[str, Tensor]  # target -> (r, in)
    lora_b: dict[str, Tensor]  # target -> (out, r)
    pos_emb: Tensor  # (Hkv, P+1, Dh)

    def delta(self, target: str, x: Tensor, scale: float) -> Tensor:
        return F.linear(F.linear(x, self.lora_a[target]), self.lora_b[target]) * scale


@dataclass(frozen=True)
class CoPEAdapter:
    config: CoPEConfig
    layers: tuple[LayerAdapter, ...]

    @property
    def lora_scale(self) -> float:
        return self.config.alpha / self.config.rank

    @classmethod
    def init(cls, forward: LlamaForward, config: CoPEConfig, seed: int = 0) -> CoPEAdapter:
        """Fresh adapter: LoRA B and the position tables at zero, so that with `keep_rope` the
        adapted model starts equal to the base model."""
        c = forward.config
        g = torch.Generator().manual_seed(seed)
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        dims = {"q": (c.hidden_size, q_out), "k": (c.hidden_size, kv_out)}
        dims |= {"v": (c.hidden_size, kv_out), "o": (q_out, c.hidden_size)}
        layers = []
        for _ in range(c.num_layers):
            a = {
                t: torch.randn(config.rank, i, generator=g) / math.sqrt(i)
                for t, (i, _o) in dims.items()
            }
            b = {t: torch.zeros(o, config.rank) for t, (_i, o) in dims.items()}
            pos = torch.zeros(c.num_kv_heads, config.max_position + 1, c.head_dim)
            layers.append(LayerAdapter(a, b, pos))
        return cls(config, tuple(layers))

    def parameters(self) -> list[Tensor]:
        out = []
        for la in self.layers:
            out += [la.lora_a[t] for t in LORA_TARGETS] + [la.lora_b[t] for t in LORA_TARGETS]
            out.append(la.pos_emb)
        return out

    def state_dict(self) -> dict[str, Tensor]:
        sd = {}
        for i, la in enumerate(self.layers):
            for t in LORA_TARGETS:
                sd[f"layers.{i}.lora_a.{t}"] = la.lora_a[t]
                sd[f"layers.{i}.lora_b.{t}"] = la.lora_b[t]
            sd[f"layers.{i}.pos_emb"] = la.pos_emb
        return sd

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Copy `sd` into this adapter's tensors (in place); shapes must match exactly."""
        own = self.state_dict()
        if set(sd) != set(own):
            missing, extra = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
            raise ValueError(f"adapter tensors differ: missing {missing[:3]}, extra {extra[:3]}")
        with torch.no_grad():
            for name, t in own.items():
                if sd[name].shape != t.shape:
                    raise ValueError(f"{name}: shape {tuple(sd[name].shape)} != {tuple(t.shape)}")
                t.copy_(sd[name])


class NoRotation(RotaryEmbedding):
    """The rotary slot of a model whose RoPE CoPE replaced: nothing is rotated, so a stored key
    is valid at any position and re-rotation is the identity."""

    def __init__(self, base: RotaryEmbedding) -> None:
        super().__init__(base.inv_freq, 1.0, "none")

    def apply(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def apply_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def rerotate(self, k: Tensor, old_positions: Tensor, new_positions: Tensor) -> Tensor:
        return k


class CoPEForward(LlamaForward):
    """`LlamaForward` with CoPE attention and LoRA on q/k/v/o. Stateless like its base; the
    adapter's tensors may require grad (training) and are read, never written, here."""

    def __init__(self, base: LlamaForward, adapter: CoPEAdapter) -> None:
        if len(adapter.layers) != base.config.num_layers:
            raise ValueError(
                f"adapter has {len(adapter.layers)} layers, model {base.config.num_layers}"
            )
        if base.structure.attention.windowed or not base.structure.uniform_rotary:
            raise ConfigError(
                f"{base.family.name} family: CoPE adapters need every layer to attend globally "
                "and rotate alike (no sliding windows, NoPE layers or per-layer RoPE bases)"
            )
        rope = base.rope if adapter.config.keep_rope else NoRotation(base.rope)
        super().__init__(base.config, base.weights, rope, base.structure, family=base.family)
        self.base = base
        self.adapter = adapter

    @property
    def max_position(self) -> int:
        return self.adapter.config.max_position

    def linear(
        self, layer: int, target: str, x: Tensor, weight: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        delta = self.adapter.layers[layer].delta(target, x, self.adapter.lora_scale)
        return super().linear(layer, target, x, weight, bias) + delta

    def attend(
        self,
        layer: int,
        hidden: Tensor,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        query_index: Tensor | None,
    ) -> Tensor:
        pos_emb = self.adapter.layers[layer].pos_emb
        attn = cope_attention(q, keys, values, query_index, self.scale, pos_emb)
        return self.finish(layer, hidden, attn)

    def positions(self, layer: int, q: Tensor, keys: Tensor, query_index: Tensor) -> Tensor:
        """Contextual positions p_ij (H, T, S) of queries q (T, H, Dh) at `query_index` over
        `keys` (S, Hkv, Dh); 0 where j > index (masked)."""
        t, h, dh = q.shape
        hkv = keys.shape[1]
        qh = q.reshape(t, hkv, h // hkv, dh).permute(1, 2, 0, 3)  # (Hkv, G, T, Dh)
        kh = keys.permute(1, 0, 2).unsqueeze(1)  # (Hkv, 1, S, Dh)
        mask = torch.arange(keys.shape[0])[None, :] <= query_index[:, None]  # (T, S)
        logits = (qh @ kh.transpose(-1, -2)) * self.scale
        return _contextual_positions(logits, mask, self.max_position).reshape(h, t, -1)


def _contextual_positions(logits: Tensor, mask: Tensor, max_position: int) -> Tensor:
    """p_ij = min(P, sum_{t=j..i} sigmoid(logit_it)) over unmasked keys. (..., T, S)

    The reverse cumsum is taken as total - cumsum + own gate (a flip-cumsum-flip copies the
    tensor twice, and is several times slower on CPU)."""
    gates = torch.sigmoid(logits) * mask
    c = gates.cumsum(-1)
    return (c[..., -1:] - c + gates).clamp(max=float(max_position))


def cope_attention(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    query_index: Tensor | None,
    scale: float,
    pos_emb: Tensor,
) -> Tensor:
    """CoPE attention, GQA. q (T, H, Dh), keys/values (S, Hkv, Dh), pos_emb (Hkv, P+1, Dh).

    `query_index` (T,): each query's index in the context (it sees keys 0..index); None means
    the queries are the last T keys in order. Returns (T, H*Dh). Queries are processed in blocks
    of QUERY_BLOCK: a query's output depends only on its own row."""
    t, s = q.shape[0], keys.shape[0]
    if query_index is None:
        query_index = torch.arange(s - t, s)
    outs = [
        _cope_block(
            q[i : i + QUERY_BLOCK], keys, values, query_index[i : i + QUERY_BLOCK], scale, pos_emb
        )
        for i in range(0, t, QUERY_BLOCK)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _cope_block(
    q: Tensor, keys: Tensor, values: Tensor, query_index: Tensor, scale: float, pos_emb: Tensor
) -> Tensor:
    t, h, dh = q.shape
    s, hkv = keys.shape[0], keys.shape[1]
    max_position = pos_emb.shape[1] - 1
    # keys beyond the furthest query are masked for every query: drop them
    s = min(s, int(query_index.max()) + 1)
    qh = q.reshape(t, hkv, h // hkv, dh).permute(1, 2, 0, 3)  # (Hkv, G, T, Dh)
    kh = keys[:s].permute(1, 0, 2).unsqueeze(1)  # (Hkv, 1, S, Dh)
    vh = values[:s].permute(1, 0, 2).unsqueeze(1)
    mask = torch.arange(s)[None, :] <= query_index[:, None]  # (T, S)
    logits = (qh @ kh.transpose(-1, -2)) * scale  # (Hkv, G, T, S)
    pos = _contextual_positions(logits, mask, max_position)
    qe = qh @ pos_emb.unsqueeze(1).transpose(-1, -2)  # (Hkv, G, T, P+1): q . e[p], once
    floor = pos.detach().floor()
    lo = floor.long()
    hi = (lo + 1).clamp(max=max_position)  # frac is 0 where p is an integer: ceil == floor
    z_lo = qe.gather(-1, lo)
    z = z_lo + (qe.gather(-1, hi) - z_lo) * (pos - floor)
    bias = torch.zeros(mask.shape, dtype=logits.dtype).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(logits + z + bias, dim=-1)
    out = probs @ vh  # (Hkv, G, T, Dh)
    return out.permute(2, 0, 1, 3).reshape(t, h * dh)


def cope_attention_reference(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    query_index: Tensor,
    scale: float,
    pos_emb: Tensor,
) -> Tensor:
    """The formulas with explicit loops over heads, queries and keys (slow; for tests)."""
    t, h, dh = q.shape
    hkv = keys.shape[1]
    max_position = pos_emb.shape[1] - 1
    out = torch.zeros(t, h, dh, dtype=q.dtype)
    for head in range(h):
        kvh = head // (h // hkv)
        for i in range(t):
            last = int(query_index[i])
            qi = q[i, head]
            gates = [torch.sigmoid(qi @ keys[j, kvh] * scale) for j in range(last + 1)]
            logits = []
            for j in range(last + 1):
                p = min(float(sum(gates[j:])), float(max_position))
                lo, hi = math.floor(p), math.ceil(p)
                w = p - lo
                z = (qi @ pos_emb[kvh, lo]) * (1 - w) + (qi @ pos_emb[kvh, hi]) * w
                logits.append(qi @ keys[j, kvh] * scale + z)
            probs = torch.softmax(torch.stack(logits), dim=0)
            out[i, head] = sum(probs[j] * values[j, kvh] for j in range(last + 1))
    return out.reshape(t, h * dh)
