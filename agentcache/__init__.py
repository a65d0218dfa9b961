"""agentcache: KV-cache reuse for LLM agents whose prompts shift, not just grow."""

from agentcache.errors import AgentCacheError

__all__ = ["AgentCacheError", "__version__"]
__version__ = "0.1.0"
