"""LangChain chat model on agentcache: `ChatAgentCache` (extra `langchain`)."""

from langchain_agentcache.chat_models import ChatAgentCache

__all__ = ["ChatAgentCache"]
