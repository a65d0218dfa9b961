"""The ids that key a model's store entries, read from its folder without loading the weights.

They equal what `agentcache.model.loading.load_folder` gives the same folder (tested), so the
embedded engine and vLLM processes find each other's segments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from agentcache.errors import ModelLoadError
from agentcache.model.loading import weights_digest
from agentcache.model.tokenizer import HFTokenizer


@dataclass(frozen=True)
class ModelIdentity:
    model_id: str
    tokenizer_id: str
    num_layers: int


def model_identity(folder: Path, name: str | None = None) -> ModelIdentity:
    from transformers import AutoTokenizer

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        num_layers = int(config["num_hidden_layers"])
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{folder}: cannot read config.json ({e})") from e
    label = name or folder.name
    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder), label)
    model_id = f"{label}#{weights_digest(folder)}"
    return ModelIdentity(model_id, tokenizer.tokenizer_id, num_layers)


def store_model_id(model_id: str, dtype: torch.dtype) -> str:
    """The model id vLLM's KV is stored under: float32 KV is the embedded engine's own (the
    two share entries); KV of another dtype carries it, so it never mixes with float32."""
    return model_id if dtype == torch.float32 else f"{model_id}@{str(dtype).removeprefix('torch.')}"
