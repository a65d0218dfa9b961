"""Prompt templates shipped with agentcache, loadable by name.

Each is a `.j2` file in this folder (segments marked with `{% segment kind, id=..., role=... %}`)
plus a pydantic input model in `inputs.py`. `docs/templates.md` shows their layouts.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import BaseModel

from agentcache.prompt.template import PromptTemplate
from agentcache.registry import Registry
from agentcache.templates.inputs import (
    MemGPTInputs,
    MemoryBlock,
    Message,
    ReflexionInputs,
    Step,
    SWEAgentInputs,
    ToolDoc,
)

TEMPLATES: Registry[BaseModel] = Registry("template")
TEMPLATES.register("reflexion")(ReflexionInputs)
TEMPLATES.register("memgpt")(MemGPTInputs)
TEMPLATES.register("swe_agent")(SWEAgentInputs)


def template_source(name: str) -> str:
    TEMPLATES.get(name)  # unknown names fail here, listing the known ones
    return resources.files(__name__).joinpath(f"{name}.j2").read_text(encoding="utf-8")


def load_template(name: str) -> PromptTemplate[Any]:
    """The shipped template `name` (reflexion, memgpt, swe_agent). Raises
    `UnknownStrategyError` (an `AgentCacheError`) for unknown names."""
    return PromptTemplate(template_source(name), TEMPLATES.get(name), name=name)


__all__ = [
    "TEMPLATES",
    "MemGPTInputs",
    "MemoryBlock",
    "Message",
    "ReflexionInputs",
    "SWEAgentInputs",
    "Step",
    "ToolDoc",
    "load_template",
    "template_source",
]
