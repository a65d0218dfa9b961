"""Which models the connector can serve segment reuse for, decided from the folder's config
alone, before vLLM or any weights load.

Segment reuse moves stored keys to new positions inside vLLM's pages with one rotary for every
layer (`StoredRunLoader`) and writes every layer's KV of a span. A model family that declares
`VLLM_REROTATION` beyond it (NoPE layers, per-layer rotaries, sliding windows, partial rotary:
`ModelFamily.limits`) is refused with an error naming the family and the feature; so is a
`model_type` no registered family declares (nothing says how its layers rotate). Prefix reuse
(`segments=False`) moves no key and needs none of this.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache.errors import ConfigError, ModelLoadError
from agentcache.model.families import family_for
from agentcache.model.families.base import VLLM_REROTATION, require


def require_rerotation(hf_config: Any) -> None:
    """Raise `ConfigError` naming the family and the feature unless the connector can re-rotate
    `hf_config`'s keys exactly."""
    model_type = str(getattr(hf_config, "model_type", None))
    try:
        family = family_for(model_type)
        structure = family.structure(hf_config)
    except ModelLoadError as e:
        raise ConfigError(f"{VLLM_REROTATION} needs a model family agentcache declares: {e}") from e
    require(family, family.limits(structure), VLLM_REROTATION, model_type)


def require_folder_rerotation(folder: Path) -> None:
    """`require_rerotation` of the model folder's config.json (no weights read)."""
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder}: cannot read config.json ({e})") from e
    require_rerotation(hf_config)
