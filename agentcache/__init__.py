"""agentcache: KV-cache reuse for LLM agents whose prompts shift, not just grow.

The public API is the names in `__all__`. The errors import at once; the rest import on first
use, so `import agentcache` (which every submodule's import runs) loads neither torch nor the
runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentcache.errors import (
    AgentCacheError,
    CacheDirError,
    ConfigError,
    ContextLengthError,
    ModelLoadError,
    OutOfPagesError,
    OutputDirError,
    ProfileError,
    PromptError,
    TraceFileError,
    UnknownStrategyError,
)

if TYPE_CHECKING:
    from agentcache.model.loading import load_model
    from agentcache.prompt.registry import load_template
    from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
    from agentcache.prompt.template import PromptTemplate
    from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
    from agentcache.session import AgentSession

__version__ = "0.1.0"

_LAZY = {  # public name -> the module that defines it
    "Engine": "agentcache.runtime.engine",
    "EngineConfig": "agentcache.runtime.engine",
    "GenerationParams": "agentcache.runtime.engine",
    "AgentSession": "agentcache.session",
    "Segment": "agentcache.prompt.segments",
    "SegmentKind": "agentcache.prompt.segments",
    "SegmentedPrompt": "agentcache.prompt.segments",
    "PromptTemplate": "agentcache.prompt.template",
    "load_template": "agentcache.prompt.registry",
    "load_model": "agentcache.model.loading",
}


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name is a type error

    def __getattr__(name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(f"module 'agentcache' has no attribute {name!r}")
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AgentCacheError",
    "AgentSession",
    "CacheDirError",
    "ConfigError",
    "ContextLengthError",
    "Engine",
    "EngineConfig",
    "GenerationParams",
    "ModelLoadError",
    "OutOfPagesError",
    "OutputDirError",
    "ProfileError",
    "PromptError",
    "PromptTemplate",
    "Segment",
    "SegmentKind",
    "SegmentedPrompt",
    "TraceFileError",
    "UnknownStrategyError",
    "__version__",
    "load_model",
    "load_template",
]
