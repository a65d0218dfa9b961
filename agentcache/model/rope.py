"""Rotary position embedding with the model's own frequency table, and exact re-rotation.

The inverse frequencies and the attention factor come from `transformers`' own RoPE init
functions (default, linear, llama3, yarn, ...), so scaled RoPE is encoded exactly as the model
was trained. `dynamic` NTK changes frequencies with sequence length and is refused: a stored key
could not be moved to a new position without knowing every future length.

Re-rotation. A key is stored rotated at position p: k_p = R(theta_p) k * m (m = attention factor,
applied once). Moving it to p' multiplies by R(theta_p' - theta_p), no second m. The model's own
angles are fp32 products fp32(p * inv_freq); rotating by fp32((p' - p) * inv_freq) differs from
fp32(theta_p') - fp32(theta_p) by ~5e-4 rad at positions in the thousands, so the delta is taken
between the two fp32-rounded angles, in float64, and only cos/sin are cast back.

Partial rotary (a share of each head's dims, `partial_rotary_factor`): the first 2 * len(inv_freq)
dims rotate, the rest pass through, in encoding and re-rotation alike. A model whose layers
rotate differently (NoPE layers, a local and a global base) re-rotates through `LayerRotary`,
which moves each layer's keys with that layer's rotary and leaves NoPE layers' keys as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentcache.errors import ModelLoadError

_EXACT_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "proportional")


def _default_inv_freq(params: dict[str, Any], head_dim: int) -> Tensor:
    base = params["rope_theta"]
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


class RotaryEmbedding:
    """RoPE for one model. `inv_freq` is (head_dim/2,) fp32; `attention_factor` scales cos/sin."""

    def __init__(
        self, inv_freq: Tensor, attention_factor: float, rope_type: str, max_positions: int = 0
    ) -> None:
        self.inv_freq = inv_freq.to(torch.float32)
        self.attention_factor = float(attention_factor)
        self.rope_type = rope_type
        # cos/sin for every position, computed once: the same fp32 products as on the fly
        self._table: tuple[Tensor, Tensor] | None = None
        if max_positions > 0:
            self._table = self._compute_cos_sin(torch.arange(max_positions))

    @classmethod
    def from_hf_config(
        cls, hf_config: Any, head_dim: int, max_positions: int = 0
    ) -> RotaryEmbedding:
        """The one rotary of a model whose layers all rotate alike (refused otherwise: a
        caller holding one rotary would move NoPE or local-base keys wrongly)."""
        from agentcache.model.families import family_for, model_types
        from agentcache.model.families.base import VLLM_REROTATION, require

        model_type = getattr(hf_config, "model_type", None)
        if model_type in model_types():
            family = family_for(model_type)
            limits = family.limits(family.structure(hf_config))
            require(family, limits, VLLM_REROTATION, model_type)
        params = getattr(hf_config, "rope_parameters", None) or {}
        return cls.from_parameters(params, hf_config, head_dim, max_positions)

    @classmethod
    def from_parameters(
        cls, params: dict[str, Any], hf_config: Any, head_dim: int, max_positions: int = 0
    ) -> RotaryEmbedding:
        """The rotary of rope `params` (one kind of a model's layers) under `hf_config`."""
        rope_type = params.get("rope_type", "default")
        if rope_type not in _EXACT_ROPE_TYPES:
            raise ModelLoadError(
                f"rope_type {rope_type!r} cannot be re-rotated exactly (its frequencies depend on "
                f"the sequence length); supported: {', '.join(_EXACT_ROPE_TYPES)}"
            )
        if rope_type == "default":
            return cls(_default_inv_freq(params, head_dim), 1.0, rope_type, max_positions)
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        if hf_config.rope_parameters is not params:  # one kind of several: its params alone
            hf_config = copy.copy(hf_config)
            object.__setattr__(hf_config, "rope_parameters", params)
        inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, None)
        return cls(inv_freq, factor, rope_type, max_positions)

    def angles(self, positions: Tensor) -> Tensor:
        """The model's own fp32 angles: (T,) -> (T, head_dim/2)."""
        return positions.to(torch.float32)[:, None] * self.inv_freq[None, :]

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(T,) -> cos, sin of shape (T, head_dim), attention factor applied."""
        table = self._table
        if table is not None and (positions.numel() == 0 or int(positions.max()) < len(table[0])):
            return table[0][positions], table[1][positions]
        return self._compute_cos_sin(positions)

    def _compute_cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        freqs = self.angles(positions)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor

    def apply(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x (T, H, D) to `positions` (T,)."""
        cos, sin = self.cos_sin(positions)
        return _rotate(x, cos.to(x.dtype), sin.to(x.dtype))

    def apply_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """`apply` to q (T, H, D) and k (T, Hkv, D) at the same `positions` (T,): one cos/sin
        lookup for both, the values `apply` reads for each (a subclass overriding `apply`
        overrides this too)."""
        cos, sin = self.cos_sin(positions)
        q = _rotate(q, cos.to(q.dtype), sin.to(q.dtype))
        return q, _rotate(k, cos.to(k.dtype), sin.to(k.dtype))

    def rerotate(self, k: Tensor, old_positions: Tensor, new_positions: Tensor) -> Tensor:
        """Move keys (..., T, H, D) rotated at old_positions (T,) to new_positions (T,)."""
        delta = self.angles(new_positions).double() - self.angles(old_positions).double()
        emb = torch.cat((delta, delta), dim=-1)  # (T, D)
        return _rotate(k, emb.cos().to(k.dtype), emb.sin().to(k.dtype))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: (..., T, H, D); cos/sin: (T, d) broadcast over heads; d < D: partial rotary.
    d = cos.shape[-1]
    if d < x.shape[-1]:
        return torch.cat((_rotate(x[..., :d], cos, sin), x[..., d:]), dim=-1)
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class LayerRotary:
    """Each layer's rotary (None: a NoPE layer, whose keys carry no position)."""

    def __init__(self, layers: Sequence[RotaryEmbedding | None]) -> None:
        self.layers = tuple(layers)
        kinds = {id(r): r for r in self.layers}
        # one rotary on every layer (most models): all layers move in one call, no copy first
        only = next(iter(kinds.values())) if len(kinds) == 1 else None
        self._uniform: RotaryEmbedding | None = only

    def rerotate_layer(
        self, layer: int, k: Tensor, old_positions: Tensor, new_positions: Tensor
    ) -> Tensor:
        """Move `layer`'s keys (T, Hkv, Dh) from old to new positions (T,)."""
        rope = self.layers[layer]
        return k if rope is None else rope.rerotate(k, old_positions, new_positions)

    def rerotate(self, keys: Tensor, old_positions: Tensor, new_positions: Tensor) -> Tensor:
        """Move every layer's keys (L, T, Hkv, Dh); layers sharing a rotary move in one call."""
        if self._uniform is not None:
            return self._uniform.rerotate(keys, old_positions, new_positions)
        out = keys.clone()
        for rope in {id(r): r for r in self.layers if r is not None}.values():
            idx = [i for i, r in enumerate(self.layers) if r is rope]
            out[idx] = rope.rerotate(keys[idx], old_positions, new_positions)
        return out
