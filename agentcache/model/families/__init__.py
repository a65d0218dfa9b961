"""The model families agentcache runs, one module each, registered here by name."""

from __future__ import annotations

from agentcache.errors import ModelLoadError
from agentcache.model.families.base import FAMILIES, ModelFamily
from agentcache.model.families.gemma3 import Gemma3Family
from agentcache.model.families.llama import LlamaFamily
from agentcache.model.families.ministral import MinistralFamily
from agentcache.model.families.phi3 import Phi3Family
from agentcache.model.families.qwen3 import Qwen3Family
from agentcache.model.families.smollm3 import SmolLM3Family

FAMILIES.register("llama")(LlamaFamily)
FAMILIES.register("qwen3")(Qwen3Family)
FAMILIES.register("smollm3")(SmolLM3Family)
FAMILIES.register("gemma3")(Gemma3Family)
FAMILIES.register("phi3")(Phi3Family)
FAMILIES.register("ministral")(MinistralFamily)


def model_types() -> tuple[str, ...]:
    """Every `model_type` a registered family runs."""
    return tuple(t for name in FAMILIES.names() for t in FAMILIES.get(name).model_types)


def family_for(model_type: str) -> ModelFamily:
    for name in FAMILIES.names():
        if model_type in FAMILIES.get(name).model_types:
            return FAMILIES.get(name)()
    raise ModelLoadError(
        f"model_type {model_type!r} is not supported; agentcache runs "
        f"{', '.join(model_types())} checkpoints"
    )
