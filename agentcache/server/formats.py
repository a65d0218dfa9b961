"""Structured-output fields of each API -> the chat layer's `OutputFormat`.

    chat completions  response_format {"type": "json_schema", "json_schema": {name, schema,
                      strict}} | {"type": "json_object"} | {"type": "text"}
    Responses         text.format {"type": "json_schema", name, schema, strict} | ...
    Messages          output_config.format {"type": "json_schema", schema}
    a forced call of a `strict` tool: its arguments held to the tool's parameters

The schema is checked for shape here (chat/schema.py, the path of the first problem named);
what llguidance cannot enforce is refused when it compiles (chat/structured.py), a 400 naming
the construct.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentcache.chat.messages import ToolSpec
from agentcache.chat.schema import validate_schema
from agentcache.chat.structured import OutputFormat
from agentcache.errors import PromptError
from agentcache.server.errors import APIError

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for a format's name


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_value", param)


def parse_format(fmt: Any, param: str, nested: bool, need_name: bool = True) -> OutputFormat | None:
    """`nested`: the schema sits under `json_schema` (chat completions), else beside `type`."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise bad(param, f"an object is required, got {type(fmt).__name__}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object", None, param)
    if kind != "json_schema":
        raise bad(f"{param}.type", f"unknown type {str(kind)[:80]!r} (expected 'text', "
                  "'json_schema' or 'json_object')")  # fmt: skip
    spec, p = (fmt.get("json_schema"), f"{param}.json_schema") if nested else (fmt, param)
    if not isinstance(spec, Mapping):
        raise bad(p, f"an object with the schema is required, got {type(spec).__name__}")
    name = spec.get("name")
    if need_name and (not isinstance(name, str) or not NAME.match(name)):
        raise bad(f"{p}.name", "a name of 1-64 letters, digits, '_' or '-' is required")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad(f"{p}.strict", f"a boolean is required, got {type(strict).__name__}")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise bad(f"{p}.schema", f"a JSON Schema object is required, got {type(schema).__name__}")
    try:
        validate_schema(schema, f"{p}.schema")
    except PromptError as e:
        raise APIError(400, str(e), "invalid_schema", f"{p}.schema") from None
    return OutputFormat("json_schema", dict(schema), f"{p}.schema")


def output_for(
    fmt: OutputFormat | None, tools: Sequence[ToolSpec], strict: Sequence[bool],
    prefill: str | None, forced: str | None, tools_param: str = "tools",
) -> OutputFormat | None:  # fmt: skip
    """What the reply is held to. `prefill`: the forced call's opening, if a call is forced;
    `forced`: the one tool it calls (None: any of several); `strict`: each tool's flag."""
    if prefill is not None and forced is None:
        return None  # the reply names its tool first; arguments are checked when parsed
    if forced is not None:
        i = next(i for i, t in enumerate(tools) if t.name == forced)
        if strict[i]:
            params = dict(tools[i].parameters)
            return OutputFormat("tool_args", params, f"{tools_param}.{i}.parameters")
        return None  # a forced call's reply is the call; a response format does not apply
    if fmt is not None and tools:
        return OutputFormat(fmt.kind, fmt.schema, fmt.param, or_call=True)
    return fmt
