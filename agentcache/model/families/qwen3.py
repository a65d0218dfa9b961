"""Qwen3: the Llama layer plus a per-head RMSNorm of q and k before RoPE (`q_norm`, `k_norm`,
weights of head_dim), no q/k/v biases by default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentcache.model.families.base import LLAMA_NAMES, ModelFamily, Structure, llama_like


class Qwen3Family(ModelFamily):
    name = "qwen3"
    model_types = ("qwen3",)
    names: ClassVar[Mapping[str, str]] = {
        **LLAMA_NAMES,
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
    }

    def structure(self, hf: Any) -> Structure:
        return llama_like(hf, qk_norm=True)
