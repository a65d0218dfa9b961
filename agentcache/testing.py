"""Tiny random models for tests and examples: seeded, built in-process, no files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentcache.model.loading import LoadedModel, from_hf
from agentcache.model.tokenizer import ByteTokenizer


def tiny_hf_model(
    model_type: str = "llama",
    seed: int = 0,
    rope_parameters: dict[str, Any] | None = None,
    num_layers: int = 4,
    max_positions: int = 4096,
) -> Any:
    """A seeded random `transformers` model with a 260-token byte vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=260,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the init default, so attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model.eval()


def tiny_model(model_type: str = "llama", seed: int = 0, **kw: Any) -> LoadedModel:
    return from_hf(tiny_hf_model(model_type, seed, **kw), ByteTokenizer(), f"tiny-{model_type}")


def scripted_sampler(text: str) -> Callable[..., int]:
    """A stand-in for `runtime.sampling.sample` on `tiny_model`'s byte tokenizer: it picks the
    bytes of `text`, then end of text, turn after turn, whatever the logits. The engine still
    computes every token's KV; tests use it where a random model's output would not round-trip
    through text."""
    queue: list[int] = []

    def sample(logits: torch.Tensor, *args: object) -> int:
        if not queue:
            queue.extend([*text.encode(), ByteTokenizer.EOS])
        return queue.pop(0)

    return sample
