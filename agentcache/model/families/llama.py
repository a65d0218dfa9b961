"""Llama, Mistral and Qwen2(.5): the Llama layer (RMSNorm, GQA, SwiGLU, RoPE incl. llama3,
linear and yarn scaling), with Qwen2's q/k/v biases and Mistral's sliding window. A window
(Mistral's `sliding_window`, Qwen2's `use_sliding_window` layers) is honoured per layer."""

from __future__ import annotations

from typing import Any

from agentcache.model.families.base import ModelFamily, Structure, llama_like


class LlamaFamily(ModelFamily):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2")

    def structure(self, hf: Any) -> Structure:
        return llama_like(hf)
