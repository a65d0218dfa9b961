"""The prompt templates shipped with agentcache: reflexion, memgpt and swe_agent.

Each is a `.j2` file in this folder (segments marked with `{% segment kind, id=..., role=... %}`)
plus a pydantic input model in `inputs.py`. `SOURCES` is the provider agentcache's template
registry loads, so `agentcache.load_template("memgpt")` finds them without importing this
package. `docs/templates.md` shows their layouts.
"""

from __future__ import annotations

from agentcache.prompt.registry import TemplateSource
from agentcache_templates.inputs import (
    MemGPTInputs,
    MemoryBlock,
    Message,
    ReflexionInputs,
    Step,
    SWEAgentInputs,
    ToolDoc,
)

SOURCES = (
    TemplateSource("reflexion", ReflexionInputs, __name__),
    TemplateSource("memgpt", MemGPTInputs, __name__),
    TemplateSource("swe_agent", SWEAgentInputs, __name__),
)

__all__ = [
    "SOURCES",
    "MemGPTInputs",
    "MemoryBlock",
    "Message",
    "ReflexionInputs",
    "SWEAgentInputs",
    "Step",
    "ToolDoc",
]
