"""Gemma 3 (text, `gemma3_text`): sliding-window layers alternating with global ones, each kind
with its own rotary ("local" base 10k on sliding layers, "global" with its scaling on full
ones); RMSNorm as x * (1 + w) everywhere, per-head q/k norms, norms on the attention and MLP
outputs (pre/post feed-forward), embeddings scaled by sqrt(hidden), softmax scale
query_pre_attn_scalar ** -0.5, GELU (tanh) MLP, final logit soft-capping when configured.

Gemma 3's forward in transformers does not apply `attn_logit_softcapping`; a config that sets
it is refused rather than run one way or the other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from agentcache.model.attention import GLOBAL_ROTARY, AttentionSpec, LayerAttention
from agentcache.model.families.base import LLAMA_NAMES, ModelFamily, Structure, layer_windows

LOCAL_ROTARY = "local"


class Gemma3Family(ModelFamily):
    name = "gemma3"
    model_types = ("gemma3_text",)
    names: ClassVar[Mapping[str, str]] = {
        **LLAMA_NAMES,
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
        "attn_out_norm": "post_attention_layernorm.weight",
        "post_norm": "pre_feedforward_layernorm.weight",
        "ff_out_norm": "post_feedforward_layernorm.weight",
    }

    def structure(self, hf: Any) -> Structure:
        if getattr(hf, "attn_logit_softcapping", None) is not None:
            raise self.refuse("attn_logit_softcapping", "transformers' Gemma 3 ignores it")
        if getattr(hf, "use_bidirectional_attention", False):
            raise self.refuse("use_bidirectional_attention", "agentcache decodes causally")
        if hf.hidden_activation != "gelu_pytorch_tanh":
            raise self.refuse(f"hidden_activation {hf.hidden_activation!r}", "gelu_pytorch_tanh")
        layers = tuple(
            LayerAttention(window=w, rotary=GLOBAL_ROTARY if w is None else LOCAL_ROTARY)
            for w in layer_windows(hf)
        )
        rope = hf.rope_parameters
        return Structure(
            attention=AttentionSpec(scale=hf.query_pre_attn_scalar**-0.5, layers=layers),
            rotaries={
                GLOBAL_ROTARY: dict(rope["full_attention"]),
                LOCAL_ROTARY: dict(rope["sliding_attention"]),
            },
            qk_norm=True,
            sandwich_norms=True,
            norm_offset=1.0,
            embed_scale=math.sqrt(hf.hidden_size),
            final_softcap=getattr(hf, "final_logit_softcapping", None),
            activation="gelu_tanh",
        )
