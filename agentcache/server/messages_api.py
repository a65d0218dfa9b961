"""Anthropic Messages bodies -> ChatRequest, and ChatResult -> Messages bodies.

    system: text or text blocks  -> one system message (blocks joined by a newline)
    user content: text blocks    -> a user message; each tool_result block -> a tool message
                                    (its tool_use_id must name an earlier tool_use)
    assistant: text + tool_use   -> an assistant message with tool calls
    a last assistant message     -> the reply's prefill: the reply continues it and returns
                                    only what follows (as the API does)
    tools: name + input_schema   -> function tools; tool_choice auto | any | tool | none
    cache_control                -> checked and counted (cache_control.py)

The messages then go through the same segmenter, strategies and reports as chat completions.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentcache.chat.diagnostics import SegmentReport
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatRequest, ChatResult
from agentcache.chat.structured import OutputFormat
from agentcache.chat.tools import forced_call_prefix
from agentcache.errors import PromptError
from agentcache.runtime.engine import GenerationParams
from agentcache.server.cache_control import Breakpoints, Retention, bad, retention
from agentcache.server.config import ServerLimits
from agentcache.server.errors import APIError
from agentcache.server.formats import output_for, parse_format
from agentcache.server.limits import limit_error
from agentcache.server.messages_schema import MessagesRequest

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")  # the API's rule for tool names
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use")


@dataclass(frozen=True)
class MessagesTurn:
    """What one Messages request becomes: the chat request, the prefill the client wrote (the
    reply leaves it out) and the retention report."""

    request: ChatRequest
    prefill: str
    retention: Retention
    stops: tuple[str, ...] = ()  # the client's stop_sequences


def _type(block: Mapping[str, Any], p: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type")
    if kind not in allowed:
        raise bad(f"{p}.type", f"unsupported block type {str(kind)[:80]!r} here (supported: "
                  f"{', '.join(allowed)})")  # fmt: skip
    return str(kind)


def _text(block: Mapping[str, Any], p: str, marks: Breakpoints) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{p}.text", f"a string is required, got {type(text).__name__}")
    marks.read(block, p, empty_text=not text)
    return text


def _block(block: Any, p: str) -> Mapping[str, Any]:
    if not isinstance(block, Mapping):
        raise bad(p, f"a content block object is required, got {type(block).__name__}")
    return block


def system_text(system: Any, marks: Breakpoints) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for i, b in enumerate(system):
        block = _block(b, f"system.{i}")
        _type(block, f"system.{i}", ("text",))
        texts.append(_text(block, f"system.{i}", marks))
    return "\n".join(texts)


class _Reader:
    """Reads `messages` in order, remembering the tool_use ids a tool_result may answer."""

    def __init__(self, marks: Breakpoints) -> None:
        self.marks = marks
        self.call_ids: set[str] = set()
        self.out: list[ChatMessage] = []

    def message(self, m: Any, i: int) -> None:
        p = f"messages.{i}"
        if not isinstance(m, Mapping):
            raise bad(p, f"a message object is required, got {type(m).__name__}")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{p}.role", f"must be 'user' or 'assistant', got {str(role)[:80]!r}")
        content = m.get("content")
        if isinstance(content, str):
            self.out.append(ChatMessage(role, content))
            return
        if not isinstance(content, list):
            raise bad(f"{p}.content", f"text or a list of blocks is required, got "
                      f"{type(content).__name__}")  # fmt: skip
        if role == "user":
            self._user(content, p)
        else:
            self._assistant(content, p)

    def _user(self, blocks: list[Any], p: str) -> None:
        texts: list[str] = []
        for j, b in enumerate(blocks):
            q = f"{p}.content.{j}"
            block = _block(b, q)
            if _type(block, q, USER_BLOCKS) == "text":
                texts.append(_text(block, q, self.marks))
                continue
            if texts:  # text before a result: its own message, in order
                self.out.append(ChatMessage("user", "\n".join(texts)))
                texts = []
            self.out.append(self._result(block, q))
        if texts or not blocks:
            self.out.append(ChatMessage("user", "\n".join(texts)))

    def _result(self, block: Mapping[str, Any], q: str) -> ChatMessage:
        uid = block.get("tool_use_id")
        if not isinstance(uid, str) or not uid:
            raise bad(f"{q}.tool_use_id", f"a non-empty string is required, got "
                      f"{type(uid).__name__}")  # fmt: skip
        if uid not in self.call_ids:
            raise bad(f"{q}.tool_use_id", f"{uid[:80]!r} names no tool_use block of an earlier "
                      "assistant message")  # fmt: skip
        is_error = block.get("is_error", False)
        if not isinstance(is_error, bool):
            raise bad(f"{q}.is_error", f"a boolean is required, got {type(is_error).__name__}")
        content = block.get("content", "")
        if isinstance(content, list):
            parts = []
            for k, b in enumerate(content):
                r = f"{q}.content.{k}"
                inner = _block(b, r)
                _type(inner, r, ("text",))
                parts.append(_text(inner, r, self.marks))
            content = "\n".join(parts)
        elif not isinstance(content, str):
            raise bad(f"{q}.content", f"text or a list of text blocks is required, got "
                      f"{type(content).__name__}")  # fmt: skip
        self.marks.read(block, q)
        text = f"Error: {content}" if is_error else content
        return ChatMessage("tool", text, tool_call_id=uid)

    def _assistant(self, blocks: list[Any], p: str) -> None:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for j, b in enumerate(blocks):
            q = f"{p}.content.{j}"
            block = _block(b, q)
            if _type(block, q, ASSISTANT_BLOCKS) == "text":
                texts.append(_text(block, q, self.marks))
            else:
                calls.append(self._use(block, q))
        self.out.append(ChatMessage("assistant", "\n".join(texts), tuple(calls)))

    def _use(self, block: Mapping[str, Any], q: str) -> ToolCall:
        uid, name, args = block.get("id"), block.get("name"), block.get("input")
        if not isinstance(uid, str) or not uid:
            raise bad(f"{q}.id", f"a non-empty string is required, got {type(uid).__name__}")
        if uid in self.call_ids:
            raise bad(f"{q}.id", f"tool_use id {uid[:80]!r} is used twice")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad(f"{q}.name", "a tool name of 1-128 letters, digits, '_' or '-' is required")
        if not isinstance(args, Mapping):
            raise bad(f"{q}.input", f"an object is required, got {type(args).__name__}")
        self.marks.read(block, q)
        self.call_ids.add(uid)
        return ToolCall(uid, name, dict(args))


def tools_of(body: MessagesRequest, limits: ServerLimits, marks: Breakpoints) -> list[ToolSpec]:
    if body.tools is None:
        return []
    if len(body.tools) > limits.max_tools:
        raise limit_error(limits, "max_tools", f"{len(body.tools)} tools", "tools")
    specs, names = [], set()
    for i, t in enumerate(body.tools):
        p = f"tools.{i}"
        tool = _block(t, p)
        if tool.get("type", "custom") != "custom":
            raise bad(f"{p}.type", f"only client tools (type 'custom') are supported, got "
                      f"{str(tool.get('type'))[:80]!r}")  # fmt: skip
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise bad(f"{p}.name", "a tool name of 1-128 letters, digits, '_' or '-' is required")
        if name in names:
            raise bad(f"{p}.name", f"tool name {name!r} is used twice")
        names.add(name)
        desc = tool.get("description", "")
        if not isinstance(desc, str):
            raise bad(f"{p}.description", f"a string is required, got {type(desc).__name__}")
        if "input_schema" not in tool:
            raise bad(f"{p}.input_schema", "a JSON Schema of type 'object' is required")
        marks.read(tool, p)
        try:
            specs.append(ToolSpec(name, desc, tool["input_schema"]))
        except PromptError as e:
            raise APIError(400, f"{p}.input_schema: {e}", "invalid_tool_schema",
                           f"{p}.input_schema") from None  # fmt: skip
    return specs


def _choice(body: MessagesRequest, tools: list[ToolSpec]) -> tuple[str | None, bool, bool]:
    """(the forced call's prefill, whether the reply may call a tool, whether parallel calls
    are allowed) from tool_choice. Under none the tools are still shown (to_turn)."""
    choice = body.tool_choice
    if choice is None:
        return None, True, True
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise bad("tool_choice.type", f"must be 'auto', 'any', 'tool' or 'none', got "
                  f"{str(kind)[:80]!r}")  # fmt: skip
    parallel = choice.get("disable_parallel_tool_use", False)
    if not isinstance(parallel, bool):
        raise bad("tool_choice.disable_parallel_tool_use", "a boolean is required")
    if kind == "none":
        return None, False, True
    if not tools:
        raise bad("tool_choice", "tool_choice needs tools")
    if kind == "tool":
        name = choice.get("name")
        if name not in {t.name for t in tools}:
            raise bad("tool_choice.name", f"names no tool of the request: {str(name)[:80]!r}")
        return forced_call_prefix(name), True, not parallel
    if kind == "any":
        return forced_call_prefix(tools[0].name if len(tools) == 1 else None), True, not parallel
    return None, True, not parallel


def _format(body: MessagesRequest) -> OutputFormat | None:
    config = body.output_config
    if config is None:
        return None
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        raise bad(f"output_config.{unknown[0]}", "unknown field (output_config takes format)")
    if config.get("effort") is not None:
        raise APIError(400, "output_config.effort: the served model does not reason; leave it "
                       "out", "unsupported_value", "output_config.effort")  # fmt: skip
    fmt = config.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
        raise bad("output_config.format.type", "must be 'json_schema'")
    return parse_format(fmt, "output_config.format", nested=False, need_name=False)


def check_unsupported(body: MessagesRequest) -> None:
    if body.top_k is not None:
        raise APIError(400, "top_k: top-k sampling is not supported; leave top_k out",
                       "unsupported_value", "top_k")  # fmt: skip
    thinking = body.thinking
    if thinking is not None and thinking.get("type") != "disabled":
        raise APIError(400, "thinking: the served model does not reason; leave thinking out "
                       "or set {'type': 'disabled'}", "unsupported_value", "thinking")  # fmt: skip


def _stops(body: MessagesRequest, limits: ServerLimits) -> tuple[str, ...]:
    stops = tuple(body.stop_sequences or ())
    if len(stops) > limits.max_stop:
        raise limit_error(limits, "max_stop", f"{len(stops)} stop sequences", "stop_sequences")
    for i, s in enumerate(stops):
        if not s:
            raise bad(f"stop_sequences.{i}", "a stop sequence must be non-empty")
        if len(s) > limits.max_stop_chars:
            what = f"stop sequence {i} of {len(s)} characters"
            raise limit_error(limits, "max_stop_chars", what, "stop_sequences")
    return stops


def _prefill(messages: list[ChatMessage]) -> str:
    """A last assistant message is continued: its text is the reply's prefill."""
    last = messages[-1]
    if last.role != "assistant":
        return ""
    if last.tool_calls:
        raise bad("messages", "the last assistant message is continued by the reply and may "
                  "hold text only, not tool_use blocks")  # fmt: skip
    if last.content != last.content.rstrip():
        raise bad("messages", "final assistant content cannot end with trailing whitespace")
    return last.content


def to_turn(
    body: MessagesRequest, conversation: str | None, tenant: str, limits: ServerLimits,
    cap_s: int,
) -> MessagesTurn:  # fmt: skip
    check_unsupported(body)
    marks = Breakpoints()
    system = system_text(body.system, marks)
    tools = tools_of(body, limits, marks)
    if len(body.messages) > limits.max_messages:
        raise limit_error(limits, "max_messages", f"{len(body.messages)} messages", "messages")
    reader = _Reader(marks)
    try:
        for i, m in enumerate(body.messages):
            reader.message(m, i)
    except PromptError as e:  # e.g. a lone surrogate in a text
        raise bad("messages", str(e)) from None
    if body.cache_control is not None:  # automatic caching: the last cacheable block
        marks.read(body.model_dump(include={"cache_control"}), "")
    marks.check_order()
    messages = reader.out
    forced, calls, parallel = _choice(body, tools)
    prefill = _prefill(messages)
    if prefill and forced:
        raise bad("tool_choice", "a forced tool call cannot continue a last assistant message")
    if prefill:
        messages = messages[:-1]
    head = [ChatMessage("system", system)] if system else []
    chat = (*head, *messages)
    _check_chars(chat, limits)
    stops = _stops(body, limits)
    if calls and tools and not parallel:
        stops = (*stops, "</tool_call>")  # the first call ends the reply (tools.py parses it)
    params = GenerationParams(max_new_tokens=body.max_tokens, temperature=body.temperature,
                              top_p=body.top_p, stop=stops)  # fmt: skip
    fmt = _format(body)
    strict = [bool(t.get("strict")) for t in body.tools or ()]
    name = (body.tool_choice or {}).get("name") if forced else None
    if forced and name is None and len(tools) == 1:
        name = tools[0].name
    callable_ = tuple(tools) if calls else ()
    output = output_for(fmt, callable_, strict if calls else [], forced, name)
    kept = retention(len(marks.ttls), marks.longest(), cap_s)
    request = ChatRequest(chat, params, tuple(tools), conversation, forced or prefill or None,
                          None, tenant, output=output, retention_s=kept.granted_s,
                          tool_calls=calls)  # fmt: skip
    return MessagesTurn(request, prefill, kept, tuple(body.stop_sequences or ()))


def _check_chars(messages: tuple[ChatMessage, ...], limits: ServerLimits) -> None:
    if not messages:
        raise bad("messages", "at least one message with content is required")
    chars = sum(len(m.content) + sum(len(c.arguments_json()) for c in m.tool_calls)
                for m in messages)  # fmt: skip
    if chars > limits.max_content_chars:
        what = f"{chars} characters of message content"
        raise limit_error(limits, "max_content_chars", what, "messages")


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_sequence(result: ChatResult, turn: MessagesTurn) -> str | None:
    """The client's stop sequence that ended the reply, if one did."""
    if result.tool_calls or result.finish_reason == "length":
        return None
    return result.stop_sequence if result.stop_sequence in turn.stops else None


def stop_reason(result: ChatResult, turn: MessagesTurn) -> str:
    if result.tool_calls:
        return "tool_use"
    if result.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence(result, turn) is not None else "end_turn"


def reply_text(result: ChatResult, prefill: str) -> str:
    """The reply's text without the prefill the client wrote."""
    content = result.content
    return content[len(prefill) :] if prefill and content.startswith(prefill) else content


def content_blocks(result: ChatResult, prefill: str) -> list[dict[str, Any]]:
    text = reply_text(result, prefill)
    blocks: list[dict[str, Any]] = []
    if text or not result.tool_calls:
        blocks.append({"type": "text", "text": text})
    for call in result.tool_calls:
        blocks.append(tool_use_block(call))
    return blocks


def tool_use_block(call: ToolCall, with_input: bool = True) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name,
            "input": dict(call.arguments) if with_input else {}}  # fmt: skip


def usage(result: ChatResult, kept: Retention) -> dict[str, Any]:
    """input_tokens + cache_read_input_tokens + cache_creation_input_tokens is the prompt, as
    in the API: read = found in the store; creation = computed here and stored (every message's
    segment); input = computed and not stored (the generation prompt, a prefill)."""
    read = result.report.reused_tokens
    stored = sum(s.num_tokens - _found(s) for s in result.report.segments if s.kind != "update")
    creation = max(0, min(stored, result.prompt_tokens - read))
    long = kept.granted_s is not None and kept.granted_s >= 3600
    return {
        "input_tokens": result.prompt_tokens - read - creation,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": creation,
        "cache_creation": {"ephemeral_5m_input_tokens": 0 if long else creation,
                           "ephemeral_1h_input_tokens": creation if long else 0},
        "output_tokens": result.completion_tokens,
        "service_tier": "standard",
    }  # fmt: skip


def _found(s: SegmentReport) -> int:
    return sum(n or 0 for n in (s.exact_tokens, s.moved_tokens, s.refreshed_tokens))


def extension(result: ChatResult, kept: Retention) -> dict[str, Any]:
    """The `agentcache` report, with the request's cache controls."""
    return {**result.report.to_dict(), "cache_control": kept.to_dict(result.retention)}


def message_body(
    body: MessagesRequest, mid: str, result: ChatResult, turn: MessagesTurn
) -> dict[str, Any]:
    return {
        "id": mid, "type": "message", "role": "assistant", "model": body.model,
        "content": content_blocks(result, turn.prefill), "stop_reason": stop_reason(result, turn),
        "stop_sequence": stop_sequence(result, turn), "usage": usage(result, turn.retention),
        "agentcache": extension(result, turn.retention),
    }  # fmt: skip
