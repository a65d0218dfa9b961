"""LangChain messages <-> agentcache chat messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import (
    ChatMessage as LCChatMessage,
)

from agentcache.chat.messages import ChatMessage, ToolCall
from agentcache.chat.runner import ChatResult
from agentcache.errors import PromptError


def to_chat_messages(messages: Sequence[BaseMessage]) -> tuple[ChatMessage, ...]:
    return tuple(to_chat_message(m) for m in messages)


def to_chat_message(msg: BaseMessage) -> ChatMessage:
    text = _text(msg)
    if isinstance(msg, SystemMessage):
        return ChatMessage("system", text)
    if isinstance(msg, HumanMessage):
        return ChatMessage("user", text)
    if isinstance(msg, AIMessage):
        calls = tuple(ToolCall(c.get("id") or "", c["name"], c["args"]) for c in msg.tool_calls)
        return ChatMessage("assistant", text, calls)
    if isinstance(msg, ToolMessage):
        return ChatMessage("tool", text, tool_call_id=msg.tool_call_id)
    if isinstance(msg, LCChatMessage):
        return ChatMessage(msg.role, text)
    raise PromptError(f"unsupported message type {type(msg).__name__}")


def _text(msg: BaseMessage) -> str:
    if isinstance(msg.content, str):
        return msg.content
    parts = []
    for block in msg.content:
        if isinstance(block, str):
            parts.append(block)
        elif block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") not in ("tool_call", "tool_use"):  # tool calls come separately
            raise PromptError(f"unsupported content block {block.get('type')!r}: text only")
    return "".join(parts)


def usage_metadata(result: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "output_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "input_token_details": {"cache_read": result.report.reused_tokens},
    }


def response_metadata(result: ChatResult, model_name: str) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "model_provider": "agentcache",
        "finish_reason": result.finish_reason,
        "agentcache": result.report.to_dict(),
    }


def tool_calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
        for c in result.tool_calls
    ]


def invalid_tool_calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {"name": None, "args": c.text, "id": None, "error": c.error, "type": "invalid_tool_call"}
        for c in result.invalid_tool_calls
    ]


def ai_message(result: ChatResult, model_name: str) -> AIMessage:
    return AIMessage(
        content=result.content,
        tool_calls=tool_calls(result),
        invalid_tool_calls=invalid_tool_calls(result),
        usage_metadata=usage_metadata(result),
        response_metadata=response_metadata(result, model_name),
    )
