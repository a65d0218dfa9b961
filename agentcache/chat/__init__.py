"""Chat messages (OpenAI / LangChain style) to segmented prompts, tool calls, and per-response
reuse diagnostics. Shared by the HTTP server and the LangChain chat model."""

from agentcache.chat.diagnostics import ReuseReport, SegmentReport
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatEngine, ChatRequest, ChatResult
from agentcache.chat.segmenter import ChatPrompt, ConversationTracker, MessagePlan
from agentcache.chat.tools import parse_tool_calls, render_tools

__all__ = [
    "ChatEngine",
    "ChatMessage",
    "ChatPrompt",
    "ChatRequest",
    "ChatResult",
    "ConversationTracker",
    "MessagePlan",
    "ReuseReport",
    "SegmentReport",
    "ToolCall",
    "ToolSpec",
    "parse_tool_calls",
    "render_tools",
]
