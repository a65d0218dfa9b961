"""Phi-3: the Llama layer with fused projections (`qkv_proj` rows q | k | v, `gate_up_proj` rows
gate | up), split at load into the roles every family has, and partial rotary
(`partial_rotary_factor`: the first share of each head's dims rotates). `longrope` (Phi-3 128k)
changes its frequencies with the sequence length and is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from agentcache.model.families.base import Heads, ModelFamily, Structure, llama_like


class Phi3Family(ModelFamily):
    name = "phi3"
    model_types = ("phi3",)
    names: ClassVar[Mapping[str, str]] = {
        "input_norm": "input_layernorm.weight",
        "wqkv": "self_attn.qkv_proj.weight",
        "wo": "self_attn.o_proj.weight",
        "post_norm": "post_attention_layernorm.weight",
        "w_gate_up": "mlp.gate_up_proj.weight",
        "w_down": "mlp.down_proj.weight",
    }

    def structure(self, hf: Any) -> Structure:
        rope = hf.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise self.refuse(f"rope_type {rope['rope_type']!r}", "its frequencies vary by length")
        return llama_like(hf)  # partial_rotary_factor: the rotated share

    def layer_tensors(
        self, sd: Mapping[str, Tensor], layer: int, config: Heads
    ) -> dict[str, Tensor | None]:
        fused = super().layer_tensors(sd, layer, config)
        wqkv, w_gate_up = fused.pop("wqkv"), fused.pop("w_gate_up")
        assert wqkv is not None and w_gate_up is not None  # required roles
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        wq, wk, wv = torch.split(wqkv, [q, kv, kv])
        w_gate, w_up = w_gate_up.chunk(2, dim=0)
        split = {"wq": wq, "wk": wk, "wv": wv, "w_gate": w_gate, "w_up": w_up}
        return {**fused, **{k: v.contiguous() for k, v in split.items()},
                "bq": None, "bk": None, "bv": None}  # fmt: skip
