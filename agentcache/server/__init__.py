"""OpenAI-compatible HTTP server (extra `server`): `agentcache serve`."""

from __future__ import annotations

from typing import Any

from agentcache.server.config import ServerConfig, ServerLimits

__all__ = ["ServerConfig", "ServerLimits", "create_app"]


def __getattr__(name: str) -> Any:
    """`create_app` imports FastAPI: only when asked for, so the CLI loads without the extra."""
    if name == "create_app":
        from agentcache.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
