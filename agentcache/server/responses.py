"""Responses API bodies -> ChatRequest, and ChatResult -> Responses bodies and stream events.

    instructions            -> a system message first (not carried by previous_response_id)
    input: "text"           -> one user message
    input items             -> messages: {"type": "message", role, content: text or parts
                               (input_text / output_text)}, function_call (an assistant tool
                               call, consecutive ones one message), function_call_output (a
                               tool message)
    previous_response_id    -> that response's stored messages before these (response_store.py)

The messages then go through the same segmenter, strategies and reports as chat completions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcache.chat.logprobs import openai_content
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec, json_problem
from agentcache.chat.runner import ChatRequest, ChatResult
from agentcache.chat.tools import TOOL_CALL_CLOSE, forced_call_prefix
from agentcache.errors import PromptError
from agentcache.runtime.engine import GenerationParams
from agentcache.server.cache_control import Retention
from agentcache.server.config import ServerLimits
from agentcache.server.convert import check_no_reasoning
from agentcache.server.errors import APIError
from agentcache.server.formats import output_for, parse_format
from agentcache.server.limits import check_arguments, limit_error
from agentcache.server.responses_schema import AllowedTools, NamedTool, ResponsesRequest

ROLES = frozenset({"user", "system", "developer", "assistant"})
LOGPROBS = "message.output_text.logprobs"
# OpenAI's `include` values. Only logprobs have anything to include here: the others name
# items this server never produces (search results, images, reasoning), so they add nothing.
INCLUDABLE = (
    LOGPROBS, "reasoning.encrypted_content", "file_search_call.results",
    "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
    "computer_call_output.output.image_url", "code_interpreter_call.outputs",
)  # fmt: skip
TEXT_PARTS = frozenset({"input_text", "output_text"})


Decode = Callable[[Sequence[int]], str]


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_value", param)


def _str(item: Mapping[str, Any], key: str, param: str, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise bad(f"{param}.{key}", f"a {'' if empty else 'non-empty '}string is required, got "
                  f"{type(value).__name__}")  # fmt: skip
    return value


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(param, f"text or a list of parts is required, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        p = f"{param}.{j}"
        if not isinstance(part, dict):
            raise bad(p, f"a part object is required, got {type(part).__name__}")
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in TEXT_PARTS:
            raise bad(f"{p}.type", f"only text parts (input_text, output_text) are supported, "
                      f"got {str(kind)[:80]!r}")  # fmt: skip
        texts.append(_str(part, "text", p, empty=True))
    return "".join(texts)


def input_messages(body: ResponsesRequest, limits: ServerLimits) -> list[ChatMessage]:
    """`input` as chat messages; APIError naming the first malformed item."""
    if isinstance(body.input, str):
        return [ChatMessage("user", body.input)]
    if not body.input:
        raise bad("input", "at least one item is required")
    if len(body.input) > limits.max_messages:
        raise limit_error(limits, "max_messages", f"{len(body.input)} input items", "input")
    out: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        p = f"input.{i}"
        if not isinstance(item, dict):
            raise bad(p, f"an item object is required, got {type(item).__name__}")
        kind = item.get("type", "message")
        try:
            if kind == "message":
                role = item.get("role")
                if not isinstance(role, str) or role not in ROLES:
                    raise bad(f"{p}.role", f"unknown role {str(role)[:80]!r} (expected one of "
                              f"{', '.join(sorted(ROLES))})")  # fmt: skip
                out.append(ChatMessage(role, _content(item.get("content"), f"{p}.content")))
            elif kind == "function_call":
                out = _add_call(out, item, p, limits)
            elif kind == "function_call_output":
                output = item.get("output")
                text = _content(output, f"{p}.output")
                out.append(ChatMessage("tool", text, tool_call_id=_str(item, "call_id", p)))
            else:
                raise bad(f"{p}.type", f"unsupported item type {str(kind)[:80]!r} (supported: "
                          "message, function_call, function_call_output)")  # fmt: skip
        except PromptError as e:
            raise bad(p, str(e)) from None
    return out


def _add_call(
    out: list[ChatMessage], item: Mapping[str, Any], p: str, limits: ServerLimits
) -> list[ChatMessage]:
    """A function_call joins the assistant message just before it (its text or its other
    calls), as one chat assistant message with tool calls."""
    call_id, name = _str(item, "call_id", p), _str(item, "name", p)
    raw = _str(item, "arguments", p, empty=True)
    check_arguments(raw, limits, f"{p}.arguments")
    try:
        args = json.loads(raw or "{}")
    except ValueError as e:  # a syntax error, or an integer past Python's 4300 digits
        raise bad(f"{p}.arguments", f"not valid JSON: {json_problem(e)}") from None
    if not isinstance(args, dict):
        raise bad(f"{p}.arguments", "a JSON object is required")
    call = ToolCall(call_id, name, args)
    if out and out[-1].role == "assistant":
        last = out[-1]
        return [*out[:-1], ChatMessage("assistant", last.content, (*last.tool_calls, call))]
    return [*out, ChatMessage("assistant", "", (call,))]


def tools_of(body: ResponsesRequest, limits: ServerLimits) -> tuple[ToolSpec, ...]:
    """The tools the prompt shows, under tool_choice none too (convert.py `_tools`)."""
    if not body.tools:
        return ()
    if len(body.tools) > limits.max_tools:
        raise limit_error(limits, "max_tools", f"{len(body.tools)} tools", "tools")
    specs = []
    for i, tool in enumerate(body.tools):
        p = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise bad(f"{p}.type", f"only function tools are supported, got {str(kind)[:80]!r}")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        try:
            specs.append(ToolSpec.from_openai({"type": "function", "function": fn}))
        except PromptError as e:
            raise APIError(400, f"{p}: {e}", "invalid_tool_schema", p) from None
    return tuple(specs)


def _prefill(body: ResponsesRequest, tools: tuple[ToolSpec, ...]) -> str | None:
    choice = body.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise bad("tool_choice", "tool_choice needs tools")
    if isinstance(choice, NamedTool):
        if choice.name not in {t.name for t in tools}:
            raise bad("tool_choice", f"tool_choice names unknown tool {choice.name!r}")
        return forced_call_prefix(choice.name)
    if choice == "required":
        return forced_call_prefix(tools[0].name if len(tools) == 1 else None)
    return None


def allow_tools(body: ResponsesRequest) -> ResponsesRequest:
    """tool_choice allowed_tools: the named tools only, offered under its mode."""
    choice = body.tool_choice
    if not isinstance(choice, AllowedTools):
        return body
    known = [t.get("name") for t in body.tools or () if isinstance(t, dict)]
    for i, t in enumerate(choice.tools):
        if t.name not in known:
            p = f"tool_choice.tools.{i}"
            raise bad(p, f"names no tool of the request: {t.name[:80]!r}")
    names = {t.name for t in choice.tools}
    tools = [t for t in body.tools or () if isinstance(t, dict) and t.get("name") in names]
    return body.model_copy(update={"tools": tools, "tool_choice": choice.mode})


def _forced_name(body: ResponsesRequest, tools: tuple[ToolSpec, ...]) -> str | None:
    if isinstance(body.tool_choice, NamedTool):
        return body.tool_choice.name
    return tools[0].name if body.tool_choice == "required" and len(tools) == 1 else None


def _logprobs(body: ResponsesRequest) -> int | None:
    """How many top logprobs per token (0: the chosen token's only); None: none asked for."""
    for i, value in enumerate(body.include or ()):
        if value not in INCLUDABLE:
            raise bad(f"include.{i}", f"unknown value {value[:80]!r}; one of "
                      f"{', '.join(INCLUDABLE)}")  # fmt: skip
    wanted = LOGPROBS in (body.include or ())
    if body.top_logprobs is not None and not wanted:
        raise bad("top_logprobs", f"needs include [{LOGPROBS!r}]")
    return (body.top_logprobs or 0) if wanted else None


def text_logprobs(result: ChatResult, decode: Decode | None) -> list[dict[str, Any]] | None:
    """The logprobs of the reply's output_text: its tokens up to the text's end (a tool call's
    tokens after it are not the text's); None when none were asked for."""
    if result.logprobs is None or decode is None:
        return None
    steps = result.logprobs
    if result.tool_calls:
        ids = [s.token_id for s in steps]
        keep = 0
        while keep < len(steps) and len(decode(ids[: keep + 1])) <= len(result.content):
            keep += 1
        steps = steps[:keep]
    return openai_content(steps, decode)


def check_content(messages: list[ChatMessage], limits: ServerLimits) -> None:
    if len(messages) > limits.max_messages:
        raise limit_error(limits, "max_messages", f"{len(messages)} messages", "input")
    chars = sum(len(m.content) + sum(len(c.arguments_json()) for c in m.tool_calls)
                for m in messages)  # fmt: skip
    if chars > limits.max_content_chars:
        what = f"{chars} characters of message content"
        raise limit_error(limits, "max_content_chars", what, "input")


def to_chat_request(
    body: ResponsesRequest, history: tuple[ChatMessage, ...], conversation: str | None,
    tenant: str, default_max_tokens: int, limits: ServerLimits,
) -> tuple[ChatRequest, tuple[ChatMessage, ...], bool]:  # fmt: skip
    """The chat request, the conversation to store (history and input, no instructions) and
    whether max_output_tokens was left to the server."""
    body = allow_tools(body)
    fmt = parse_format(body.text.format if body.text else None, "text.format", nested=False)
    check_no_reasoning(body.reasoning, "reasoning")
    if body.user is not None and len(body.user) > limits.max_user_chars:
        raise limit_error(limits, "max_user_chars", f"user of {len(body.user)} characters", "user")
    turn = (*history, *input_messages(body, limits))
    head = (ChatMessage("system", body.instructions),) if body.instructions else ()
    messages = (*head, *turn)
    check_content(list(messages), limits)
    tools = tools_of(body, limits)
    prefill = _prefill(body, tools)
    max_tokens = body.max_output_tokens
    calls = body.tool_choice != "none"  # none: the tools are shown, the reply is text
    stops = (TOOL_CALL_CLOSE,) if calls and tools and body.parallel_tool_calls is False else ()
    params = GenerationParams(
        max_new_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=body.temperature, top_p=body.top_p, stop=stops,
    )  # fmt: skip
    strict = [bool(t.get("strict")) for t in body.tools or ()] if tools else []
    output = output_for(fmt, tools if calls else (), strict, prefill, _forced_name(body, tools))
    request = ChatRequest(messages, params, tools, conversation, prefill, None, tenant,
                          body.prompt_cache_key, output, _logprobs(body),
                          tool_calls=calls)  # fmt: skip
    return request, turn, max_tokens is None


@dataclass
class ResponseIds:
    """The ids of one response and its output items."""

    rid: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    message: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")

    def call(self, index: int) -> str:
        return f"fc_{self.rid[5:]}_{index}"


def usage(result: ChatResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.report.reused_tokens},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def message_item(ids: ResponseIds, text: str, status: str = "completed",
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    content = [] if status == "in_progress" else [text_part(text, logprobs)]
    return {"type": "message", "id": ids.message, "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def call_item(ids: ResponseIds, call: ToolCall, index: int, args: str) -> dict[str, Any]:
    status = "completed" if args else "in_progress"
    return {"type": "function_call", "id": ids.call(index), "call_id": call.id,
            "name": call.name, "arguments": args, "status": status}  # fmt: skip


def output_items(
    result: ChatResult, ids: ResponseIds, decode: Decode | None = None
) -> list[dict[str, Any]]:
    items = []
    if result.content or not result.tool_calls:
        items.append(message_item(ids, result.content, logprobs=text_logprobs(result, decode)))
    for i, call in enumerate(result.tool_calls):
        items.append(call_item(ids, call, i, call.arguments_json()))
    return items


def response_body(
    body: ResponsesRequest, ids: ResponseIds, created: int, result: ChatResult | None,
    cache_control: Retention | None = None, decode: Decode | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The response object; `result` None: one in progress (the stream's first events).
    `decode` (token ids -> text) names the tokens of logprobs, when they were asked for."""
    status, incomplete = "in_progress", None
    if result is not None:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens"}
    choice = body.tool_choice
    out: dict[str, Any] = {
        "id": ids.rid, "object": "response", "created_at": created, "status": status,
        "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "model": body.model,
        "output": [] if result is None else output_items(result, ids, decode),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
        "text": {"format": (body.text.format if body.text and body.text.format
                            else {"type": "text"})},
        "tool_choice": choice if isinstance(choice, str) else (choice.model_dump() if choice
                                                                else "auto"),
        "tools": body.tools or [], "metadata": body.metadata or {}, "usage": None,
    }  # fmt: skip
    if result is not None:
        out["usage"] = usage(result)
        out["agentcache"] = result.report.to_dict()
        if cache_control is not None:
            out["agentcache"]["cache_control"] = cache_control.to_dict(result.retention)
    return out


class ResponsesEmitter:
    """The Responses stream: response.created, response.in_progress; for text, the message
    item and its part (added at the first piece), output_text deltas and the done events; one
    function_call item per call with its arguments; response.completed (or .incomplete).
    `on_result` runs before the last event (it stores the response)."""

    def __init__(self, body: ResponsesRequest, ids: ResponseIds, created: int,
                 on_result: Callable[[ChatResult], None],
                 cache_control: Retention | None = None,
                 decode: Decode | None = None) -> None:  # fmt: skip
        self.body, self.ids, self.created, self.on_result = body, ids, created, on_result
        self.cache_control, self.decode = cache_control, decode
        self.seq, self.opened = 0, False
        self.text_parts: list[str] = []

    def event(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def start(self) -> Iterator[str]:
        response = response_body(self.body, self.ids, self.created, None)
        yield self.event("response.created", response=response)
        yield self.event("response.in_progress", response=response)

    def _open(self) -> Iterator[str]:
        if not self.opened:
            self.opened = True
            item = message_item(self.ids, "", "in_progress")
            yield self.event("response.output_item.added", output_index=0, item=item)
            yield self.event("response.content_part.added", item_id=self.ids.message,
                             output_index=0, content_index=0, part=text_part(""))  # fmt: skip

    def text(self, piece: str) -> Iterator[str]:
        yield from self._open()
        self.text_parts.append(piece)
        yield self.event("response.output_text.delta", item_id=self.ids.message,
                         output_index=0, content_index=0, delta=piece, logprobs=[])  # fmt: skip

    def finish(self, result: ChatResult) -> Iterator[str]:
        index = 0
        if result.content or not result.tool_calls:
            yield from self._open()
            rest = result.content[len("".join(self.text_parts)) :]
            if rest:  # the runner's pieces add up to the content; anything left comes now
                yield from self.text(rest)
            m, text = self.ids.message, result.content
            lp = text_logprobs(result, self.decode)  # known once the reply is: sent whole here
            yield self.event("response.output_text.done", item_id=m, output_index=0,
                             content_index=0, text=text, logprobs=lp or [])  # fmt: skip
            yield self.event("response.content_part.done", item_id=m, output_index=0,
                             content_index=0, part=text_part(text, lp))  # fmt: skip
            yield self.event("response.output_item.done", output_index=0,
                             item=message_item(self.ids, text, logprobs=lp))  # fmt: skip
            index = 1
        for i, call in enumerate(result.tool_calls):
            args, o = call.arguments_json(), index + i
            yield self.event("response.output_item.added", output_index=o,
                             item=call_item(self.ids, call, i, ""))  # fmt: skip
            yield self.event("response.function_call_arguments.delta", item_id=self.ids.call(i),
                             output_index=o, delta=args)  # fmt: skip
            yield self.event("response.function_call_arguments.done", item_id=self.ids.call(i),
                             output_index=o, arguments=args)  # fmt: skip
            yield self.event("response.output_item.done", output_index=o,
                             item=call_item(self.ids, call, i, args))  # fmt: skip
        self.on_result(result)
        response = response_body(self.body, self.ids, self.created, result, self.cache_control,
                                 self.decode)  # fmt: skip
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield self.event(kind, response=response)

    def error(self, err: APIError) -> str:
        e = err.body()["error"]
        return self.event("error", code=e["code"], message=e["message"], param=e["param"])
