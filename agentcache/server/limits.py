"""Request limits, checked before anything is tokenized: each a flag, each exceeded one a 4xx
that names it.

    bytes arrive -> BodyLimit: body size (while reading), JSON nesting depth (before parsing)
    parsed body  -> check_request: messages, tools, stop strings, user, content characters
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from agentcache.server.errors import APIError
from agentcache.server.schemas import ChatCompletionRequest

MiB = 1 << 20


@dataclass(frozen=True)
class ServerLimits:
    """Defaults fit an agent's whole history on a long-context model; each is a serve flag
    (`--max-body-bytes` for `max_body_bytes`, ...)."""

    max_body_bytes: int = 8 * MiB
    max_depth: int = 64  # JSON nesting of the body (a tool schema, a tool call's arguments)
    max_messages: int = 2048
    max_tools: int = 256
    max_stop: int = 16  # stop strings
    max_stop_chars: int = 256  # characters of one stop string
    max_user_chars: int = 256  # the `user` field
    max_content_chars: int = 4_000_000  # message contents and tool-call arguments, all together

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name} must be an integer >= 1, got {value!r}")


def flag(name: str) -> str:
    """The serve flag of a limit: max_body_bytes -> --max-body-bytes."""
    return "--" + name.replace("_", "-")


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
    chars = content_chars(body)
    if chars > limits.max_content_chars:
        what = f"{chars} characters of message content"
        raise limit_error(limits, "max_content_chars", what, "messages")


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


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth(data: bytes, limit: int) -> int:
    """Nesting depth of the JSON text `data`, counted up to `limit + 1` (no parsing, so a
    5000-deep value costs one scan, not 5000 frames of recursion). Brackets inside strings
    do not count."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', data)):
        if m.group() in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest
