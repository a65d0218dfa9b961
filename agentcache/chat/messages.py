"""Chat messages and tool specs as plain frozen values, parsed from OpenAI-style dicts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentcache.chat.schema import validate_tool_parameters
from agentcache.errors import PromptError
from agentcache.prompt.segments import check_unicode

# "developer" is OpenAI's newer name for a system message; it is rendered as one.
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Mapping[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise PromptError(
                f"unknown message role {self.role!r}; expected one of: {', '.join(MESSAGE_ROLES)}"
            )
        if not isinstance(self.content, str):
            raise PromptError(f"message content must be text, got {type(self.content).__name__}")
        check_unicode(self.content, f"{self.role} message content")
        for call in self.tool_calls:
            try:  # the prompt carries them as JSON: a value JSON has no form for is an error
                arguments = call.arguments_json()
            except (TypeError, ValueError) as e:  # a datetime, a set, a cycle
                raise PromptError(
                    f"tool call {call.name!r}: arguments must be JSON values ({e})"
                ) from None
            check_unicode(f"{call.name} {arguments}", f"tool call {call.name!r}")

    @property
    def chat_role(self) -> str:
        """The role the chat format wraps it in."""
        return "system" if self.role == "developer" else self.role

    @classmethod
    def from_openai(cls, d: Mapping[str, Any]) -> ChatMessage:
        if "role" not in d:
            raise PromptError(f"a message needs a 'role', got keys {sorted(d)}")
        calls = tuple(_tool_call_from_openai(c) for c in d.get("tool_calls") or ())
        return cls(
            str(d["role"]), content_text(d.get("content")), calls, d.get("tool_call_id"),
            d.get("name"),
        )  # fmt: skip


def content_text(content: Any) -> str:
    """OpenAI content: a string, null, or a list of parts of which only text parts are kept."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise PromptError(f"unsupported message content part {kind!r}: only text parts")
            text = part.get("text", "")
            if not isinstance(text, str):
                raise PromptError(f"a text part's 'text' must be a string, got {text!r}")
            texts.append(text)
        return "".join(texts)
    raise PromptError(f"message content must be text or a list of parts, got {content!r}")


def json_problem(error: object) -> str:
    """A JSON parser's message for a client: Python's note on raising its integer digit limit
    (`sys.set_int_max_str_digits`) is advice to the server's code, not to the sender."""
    return re.sub(r";\s*use sys\.set_int_max_str_digits\(\)[^;]*", "", str(error))


def _tool_call_from_openai(d: Mapping[str, Any]) -> ToolCall:
    fn = d.get("function") or {}
    raw = fn.get("arguments", "{}")
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as e:  # a syntax error, or an integer past Python's 4300 digits
        raise PromptError(f"tool call arguments are not valid JSON: {json_problem(e)}") from None
    except RecursionError:  # the server bounds the depth first (server/limits.py)
        raise PromptError("tool call arguments are nested too deeply") from None
    if not isinstance(args, Mapping):
        raise PromptError("tool call arguments must be a JSON object")
    if "name" not in fn:
        raise PromptError("a tool call needs function.name")
    return ToolCall(str(d.get("id", "")), str(fn["name"]), dict(args))


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise PromptError("a tool needs a non-empty function name")
        validate_tool_parameters(self.parameters, f"tool {self.name!r} parameters")
        check_unicode(json.dumps(self.to_openai(), ensure_ascii=False), f"tool {self.name!r}")

    @classmethod
    def from_openai(cls, d: Mapping[str, Any]) -> ToolSpec:
        if d.get("type", "function") != "function":
            raise PromptError(f"unsupported tool type {d.get('type')!r}: only 'function'")
        fn = d.get("function")
        if not isinstance(fn, Mapping):
            raise PromptError("a tool needs a 'function' object with a name")
        params = fn.get("parameters")
        if params is None:  # omitted (or null): a function without parameters
            params = {"type": "object", "properties": {}}
        name, description = fn.get("name"), fn.get("description")  # description null: none
        if not isinstance(name, str):  # strict, as a typed request field is: 5 is not "5"
            raise PromptError(f"a tool's function name must be a string, got {name!r:.60}")
        if description is not None and not isinstance(description, str):
            raise PromptError(f"a tool's description must be a string, got {description!r:.60}")
        return cls(name, description or "", params)

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }
