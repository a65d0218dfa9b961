"""OpenAI-compatible HTTP server (extra `server`): `agentcache serve`."""

from agentcache.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
