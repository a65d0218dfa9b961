"""Model configuration: the subset of a Hugging Face config the forward pass needs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from agentcache.errors import ModelLoadError
from agentcache.model.families import model_types
from agentcache.model.families.base import hf_head_dim, hf_kv_heads

SUPPORTED_MODEL_TYPES = model_types()  # every registered family's (model/families/)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model_type {self.model_type!r} is not supported; "
                f"agentcache runs {', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
            )
        positive = [("rms_norm_eps", self.rms_norm_eps), *rope_thetas(self.rope_parameters)]
        for where, value in positive:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0):
                raise ModelLoadError(f"{where} must be a finite number > 0, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )

    @property
    def rope_type(self) -> str:
        return str(self.rope_parameters.get("rope_type", "default"))

    def qkv_fraction(self) -> float:
        """Share of a layer's FLOPs spent in the Q/K/V projection (the cost of a Q/K/V-only
        pass, as a deviation check or a CCPE encoding runs)."""
        qkv = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn_out = self.hidden_size * self.num_heads * self.head_dim
        return qkv / (qkv + attn_out + 3 * self.hidden_size * self.intermediate_size)

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Build from a `transformers` PretrainedConfig (v5 `rope_parameters` layout; a family
        with several rotaries keeps them by layer kind, as its config does)."""
        rope = dict(getattr(hf, "rope_parameters", None) or {})
        rope.setdefault("rope_type", "default")
        return cls(
            model_type=hf.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads,
            num_kv_heads=hf_kv_heads(hf),
            head_dim=hf_head_dim(hf),
            rms_norm_eps=hf.rms_norm_eps,
            max_position_embeddings=hf.max_position_embeddings,
            rope_parameters=rope,
            attention_bias=bool(getattr(hf, "attention_bias", hf.model_type == "qwen2")),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        )


def rope_thetas(rope: Any, where: str = "rope_parameters") -> list[tuple[str, Any]]:
    """Every `rope_theta` in a config's rope parameters, with its place: at the top, or in
    the per-layer-kind dicts of a family with several rotaries (Gemma 3)."""
    if not isinstance(rope, dict):
        return []
    found = [(f"{where}.rope_theta", rope["rope_theta"])] if "rope_theta" in rope else []
    for key, value in rope.items():
        if isinstance(value, dict):
            found += rope_thetas(value, f"{where}.{key}")
    return found
