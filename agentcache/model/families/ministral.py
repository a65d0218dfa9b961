"""Ministral: the Mistral layer (no q/k/v biases) with sliding-window layers interleaved with
global ones, per `layer_types` (windows of `sliding_window`); one rotary on every layer."""

from __future__ import annotations

from typing import Any

from agentcache.model.families.base import ModelFamily, Structure, llama_like


class MinistralFamily(ModelFamily):
    name = "ministral"
    model_types = ("ministral",)

    def structure(self, hf: Any) -> Structure:
        return llama_like(hf)  # windows per layer from `layer_types`
