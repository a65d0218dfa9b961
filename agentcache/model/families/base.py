"""The model-family seam: one module per architecture, registered by name.

A family turns a `transformers` config into a `Structure` (what its forward does beyond
Llama's: per-layer attention, rotaries, norms, scales) and names the checkpoint's tensors for
each role `LayerWeights` holds. `LlamaForward` runs any structure; adding a family is one
module here plus its `@FAMILIES.register` line in `families/__init__.py`.

Contract of `ModelFamily`:
- `structure(hf)` reads the config only; it raises `ModelLoadError` naming the family and the
  option for a configuration it cannot run exactly (never runs it approximately);
- `layer_tensors(sd, layer, config)` returns the role -> tensor map of one layer, fp32, without
  mutating `sd`; a missing tensor is a `KeyError` with its name (the loader reports the file);
- `limits(structure)` maps each feature of `FEATURES` the family cannot serve with this
  structure to the reason; `require` turns a limit into a `ConfigError` at configuration time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from agentcache.errors import ConfigError, ModelLoadError
from agentcache.model.attention import GLOBAL_ROTARY, AttentionSpec, LayerAttention
from agentcache.registry import Registry

# what a caller may ask of a model beyond prefill and dense decode
SEGMENT_REUSE = "segment reuse (re-rotating cached segments: pic, epic, cacheblend, ...)"
SPARSE_DECODE = "sparse decode (decode policies other than dense)"
VLLM_REROTATION = "the vLLM connector's re-rotation"
FEATURES = (SEGMENT_REUSE, SPARSE_DECODE, VLLM_REROTATION)
# reuse strategies that never move a cached key to a new position: exact for every family
# (prefix: the same tokens at the same positions; promptcache: a segment only where it was)
POSITION_KEEPING_STRATEGIES = frozenset({"full", "prefix", "promptcache"})

# LayerWeights roles -> the Llama checkpoint's tensor names (after "model.layers.{i}.")
LLAMA_NAMES: dict[str, str] = {
    "input_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "post_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
OPTIONAL_ROLES = frozenset({"bq", "bk", "bv"})
NORM_ROLES = frozenset({"input_norm", "post_norm", "q_norm", "k_norm", "attn_out_norm",
                        "ff_out_norm"})  # fmt: skip


class Heads(Protocol):
    """The sizes a family reads to split fused tensors (a `ModelConfig`)."""

    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


@dataclass(frozen=True)
class Structure:
    """What a model's forward does beyond Llama's (the defaults are Llama's)."""

    attention: AttentionSpec
    rotaries: Mapping[str, dict[str, Any]]  # rotary name -> its rope parameters
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # RMSNorm of the attention and MLP outputs (Gemma 3)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): Gemma's (1 + w)
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(hidden))
    final_softcap: float | None = None  # logits <- c * tanh(logits / c)
    activation: str = "silu"  # MLP gate activation: silu, gelu_tanh
    rotary_share: float = 1.0  # share of each head's dims rotated (the rest pass through)

    def __post_init__(self) -> None:
        used = {r for r in self.attention.rotaries if r is not None}
        if missing := used - set(self.rotaries):
            raise ModelLoadError(f"layers name rotaries {sorted(missing)} the model lacks")

    @property
    def uniform_rotary(self) -> bool:
        """Every layer rotates q/k with the same rotary (no NoPE layer, one base)."""
        return len(set(self.attention.rotaries)) == 1 and None not in self.attention.rotaries


class ModelFamily(ABC):
    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]
    names: ClassVar[Mapping[str, str]] = LLAMA_NAMES

    @abstractmethod
    def structure(self, hf: Any) -> Structure: ...

    def layer_tensors(
        self, sd: Mapping[str, Tensor], layer: int, config: Heads
    ) -> dict[str, Tensor | None]:
        p = f"model.layers.{layer}."
        out: dict[str, Tensor | None] = {}
        for role, name in self.names.items():
            if role in OPTIONAL_ROLES and p + name not in sd:
                out[role] = None
                continue
            out[role] = sd[p + name].to(torch.float32).contiguous()
        return out

    def limits(self, s: Structure) -> dict[str, str]:
        """Features this model cannot serve yet -> why (derived from its structure)."""
        out = {}
        if s.attention.windowed:
            out[VLLM_REROTATION] = (
                "a sliding-window layer's reused KV outside every window is not loaded, and "
                "the connector writes every layer's KV of a span into vLLM's pages"
            )
        if not s.uniform_rotary:
            why = "its layers rotate keys differently (NoPE layers or per-layer RoPE bases)"
            out[VLLM_REROTATION] = why + "; the connector moves every layer's keys alike"
        elif s.rotary_share < 1.0:
            out[VLLM_REROTATION] = (
                f"partial rotary (a share of {s.rotary_share:g} of each head's dims rotates): "
                "re-rotating it in vLLM's KV pages is not proven against vLLM's own rotary"
            )
        return out

    def refuse(self, option: str, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.name} family: {option} is not supported ({why})")


def require(family: ModelFamily, limits: Mapping[str, str], feature: str, model_type: str) -> None:
    """Raise `ConfigError` if `feature` is one of the model's `limits`."""
    if feature in limits:
        raise ConfigError(
            f"{family.name} family ({model_type}) does not support {feature} yet: {limits[feature]}"
        )


def require_strategy(
    family: ModelFamily, limits: Mapping[str, str], strategy: str, model_type: str
) -> None:
    """Raise `ConfigError` if reuse strategy `strategy` needs a feature the model lacks."""
    if strategy in POSITION_KEEPING_STRATEGIES or SEGMENT_REUSE not in limits:
        return
    keeping = ", ".join(sorted(POSITION_KEEPING_STRATEGIES))
    raise ConfigError(
        f"{family.name} family ({model_type}) does not support strategy {strategy!r} yet: "
        f"it needs {SEGMENT_REUSE}, and {limits[SEGMENT_REUSE]}; use one of {keeping}"
    )


def layer_windows(hf: Any) -> list[int | None]:
    """Each layer's sliding window from `sliding_window` and `layer_types` (transformers'
    convention: with `layer_types`, only "sliding_attention" layers slide; without, every
    layer does when `sliding_window` is set)."""
    n = hf.num_hidden_layers
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None)
    if types is not None and (odd := set(types) - {"full_attention", "sliding_attention"}):
        raise ModelLoadError(f"{hf.model_type}: layer_types {sorted(odd)} are not supported")
    if window is None:
        if types is not None and "sliding_attention" in types:
            raise ModelLoadError(f"{hf.model_type}: sliding layers without a sliding_window")
        return [None] * n
    if types is None:
        return [int(window)] * n
    return [int(window) if t == "sliding_attention" else None for t in types]


def plain_rope(hf: Any) -> dict[str, Any]:
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    rope.setdefault("rope_type", "default")
    return rope


def hf_head_dim(hf: Any) -> int:
    """A `transformers` config's attention head size: `head_dim`, else hidden / heads."""
    return int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)


def hf_kv_heads(hf: Any) -> int:
    """A `transformers` config's K/V heads: `num_key_value_heads`, else one per query head."""
    return int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads)


def llama_like(
    hf: Any, rotary: Callable[[int], str | None] = lambda i: GLOBAL_ROTARY, **kw: Any
) -> Structure:
    """A Llama-shaped structure: one rotary, windows from the config, head_dim ** -0.5, and
    a SwiGLU MLP (`hidden_act` silu: another would be run as silu, a different model)."""
    act = getattr(hf, "hidden_act", "silu")
    if act not in ("silu", "swish") and kw.get("activation", "silu") == "silu":
        raise ModelLoadError(
            f"{hf.model_type}: hidden_act {act!r} is not supported (this family's MLP gate "
            "runs silu)"
        )
    head_dim = hf_head_dim(hf)
    layers = tuple(
        LayerAttention(window=w, rotary=rotary(i)) for i, w in enumerate(layer_windows(hf))
    )
    spec = AttentionSpec(scale=head_dim**-0.5, layers=layers)
    rope = plain_rope(hf)
    kw.setdefault("rotary_share", float(rope.get("partial_rotary_factor", 1.0)))
    return Structure(attention=spec, rotaries={GLOBAL_ROTARY: rope}, **kw)


FAMILIES: Registry[ModelFamily] = Registry("model family")
