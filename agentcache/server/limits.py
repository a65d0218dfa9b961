"""Request limits, checked before anything is tokenized: each a flag, each exceeded one a 4xx
that names it.

    bytes arrive -> BodyLimit: body size (while reading), JSON nesting depth and lone
                    surrogates (before parsing)
    parsed body  -> check_request: messages, tools, stop strings, user, content characters
    ChatRequest  -> check_tools: characters of tool names, descriptions and schemas (every API)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from agentcache.chat.messages import ToolSpec
from agentcache.chat.runner import prompt_chars, tool_chars
from agentcache.server.config import ServerLimits, flag
from agentcache.server.errors import APIError
from agentcache.server.schemas import ChatCompletionRequest

__all__ = ["check_arguments", "check_request", "check_tools", "limit_error", "prompt_chars"]


def limit_error(limits: ServerLimits, name: str, what: str, param: str | None) -> APIError:
    status = 413 if name == "max_body_bytes" else 400
    message = f"{what} exceeds the server's limit ({flag(name)} {getattr(limits, name)})"
    return APIError(status, message, "limit_exceeded", param)


def check_request(body: ChatCompletionRequest, limits: ServerLimits) -> None:
    """Raises APIError (400 `limit_exceeded`) naming the first limit `body` exceeds."""
    if len(body.messages) > limits.max_messages:
        raise limit_error(limits, "max_messages", f"{len(body.messages)} messages", "messages")
    if body.tools and len(body.tools) > limits.max_tools:
        raise limit_error(limits, "max_tools", f"{len(body.tools)} tools", "tools")
    stops = body.stop_strings()
    if len(stops) > limits.max_stop:
        raise limit_error(limits, "max_stop", f"{len(stops)} stop strings", "stop")
    for i, stop in enumerate(stops):
        if len(stop) > limits.max_stop_chars:
            what = f"stop string {i} of {len(stop)} characters"
            raise limit_error(limits, "max_stop_chars", what, "stop")
    if body.user is not None and len(body.user) > limits.max_user_chars:
        raise limit_error(limits, "max_user_chars", f"user of {len(body.user)} characters", "user")
    for i, m in enumerate(body.messages):
        for j, call in enumerate(m.tool_calls or ()):
            check_arguments(call.function.arguments, limits, f"messages.{i}.tool_calls.{j}"
                            ".function.arguments")  # fmt: skip
    chars = content_chars(body)
    if chars > limits.max_content_chars:
        what = f"{chars} characters of message content"
        raise limit_error(limits, "max_content_chars", what, "messages")


def check_tools(tools: Sequence[ToolSpec], limits: ServerLimits) -> None:
    """Tool descriptions and schemas are prompt text too: bounded before any tokenizing."""
    chars = tool_chars(tools)
    if chars > limits.max_tool_chars:
        what = f"{chars} characters of tool names, descriptions and parameters"
        raise limit_error(limits, "max_tool_chars", what, "tools")


def check_arguments(arguments: object, limits: ServerLimits, param: str) -> None:
    """Arguments sent as a JSON string are JSON inside JSON: the body's depth check never saw
    their nesting, so it is bounded here, before anything parses them."""
    if isinstance(arguments, str) and json_depth(arguments.encode(), limits.max_depth) > (
        limits.max_depth
    ):
        what = "the JSON nesting depth of tool call arguments"
        raise limit_error(limits, "max_depth", what, param)


def content_chars(body: ChatCompletionRequest) -> int:
    total = 0
    for m in body.messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content is not None:
            total += sum(len(str(part.get("text", ""))) for part in m.content)
        for call in m.tool_calls or ():
            args = call.function.arguments
            total += len(args) if isinstance(args, str) else len(str(args))
    return total


# a JSON string: runs of plain bytes between escapes ("unrolled", so a long plain text is one
# step of the regex engine, not one per byte)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def blank_strings(data: bytes) -> bytes:
    """The JSON text `data` with every string emptied (`""`): what the scans below read, so
    that a bracket or a word inside text is not taken for JSON. `blanked=True` tells them
    `data` is this already (one pass over a body for several scans)."""
    return _STRING.sub(b'""', data)


def json_depth(data: bytes, limit: int, blanked: bool = False) -> int:
    """Nesting depth of the JSON text `data`, counted up to `limit + 1` (no parsing, so a
    5000-deep value costs one scan, not 5000 frames of recursion). Brackets inside strings
    do not count."""
    depth = deepest = 0
    for m in _BRACKET.finditer(data if blanked else blank_strings(data)):
        if m.group() in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


_NONFINITE = re.compile(rb"-?(?:NaN|Infinity)")
_EXPONENT = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?[eE][+-]?[0-9]+")


def nonfinite_number(data: bytes, blanked: bool = False) -> str | None:
    """The first number of the JSON text `data` that is not a finite double, as written:
    `NaN` and `Infinity`, which JSON does not have but Python's parser reads, or an exponent
    past a double's range (`1E400`, read as infinity). Every later use of such a value (a
    comparison, a response that echoes it, a schema bound) goes wrong, so the body is refused
    as OpenAI's API refuses it. None when every number is finite; strings are skipped."""
    plain = data if blanked else blank_strings(data)
    if m := _NONFINITE.search(plain):
        return m.group().decode()
    for m in _EXPONENT.finditer(plain):
        if math.isinf(float(m.group())):
            return m.group().decode()[:40]
    return None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")


def lone_surrogate(data: bytes) -> bool:
    """Whether the JSON text `data` escapes a UTF-16 surrogate outside a pair (`\\ud800`
    alone) or encodes one in its bytes (not UTF-8, but Python's JSON parser reads bytes with
    surrogatepass): text that no tokenizer, hash or response encoder can encode. A few regex
    passes, none in Python per escape: escaped backslashes are blanked first (`\\\\ud800` is
    one and text), then every pair of escapes is removed, and any surrogate escape left is
    alone."""
    if _ENCODED_SURROGATE.search(data):
        return True
    if not _SURROGATE_ESCAPE.search(data):
        return False
    text = _SURROGATE_PAIR.sub(b"", data.replace(b"\\\\", b"  "))
    return _SURROGATE_ESCAPE.search(text) is not None


def surrogate_path(data: bytes) -> str | None:
    """The dotted path (`messages.2.content`) of the first string, key or value, of the JSON
    text `data` that is not valid Unicode; "" for the whole body, None if there is none or
    the text is not JSON (its parser says why)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None

    def bad(s: str) -> bool:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False

    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str) and bad(v):
            return path
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        children = []
        for k, child in items:
            name = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and bad(k):
                return name.encode("utf-8", "backslashreplace").decode()
            children.append((name, child))
        stack.extend(reversed(children))
    return None
