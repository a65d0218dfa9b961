"""Tools in the prompt and tool calls in the model's output, in the Hermes / Qwen format.

Tools are described to the model after the system message:

    # Tools
    ...
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>
    ...

and a tool call is a JSON object inside tags, one per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

An unterminated last block (generation stopped inside it) is parsed if its JSON is complete;
when it is not and no block before it was a valid call, the whole text is the reply's content
(a reply cut by max_tokens inside a call keeps its text, with finish reason "length").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentcache.chat.messages import ToolCall, ToolSpec, json_problem

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def chat_template() -> Path:
    """A jinja chat template that renders a message list and its tools for a ChatML model as
    the server does (the tools block, tool calls, `developer` as `system`): for another engine
    serving the same model, e.g. `vllm serve --chat-template`, so it sends the same text."""
    return Path(__file__).with_name("chatml_tools.jinja")


def render_tools(tools: Sequence[ToolSpec]) -> str:
    lines = (json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return TOOLS_HEADER + "\n".join(lines) + TOOLS_FOOTER


def format_tool_call(call: ToolCall) -> str:
    body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def forced_call_prefix(name: str | None) -> str:
    """The start of a reply that must call `name` (or some tool when None)."""
    if name is None:
        return f'{TOOL_CALL_OPEN}\n{{"name": "'
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": '


@dataclass(frozen=True)
class InvalidToolCall:
    text: str  # the block's body as the model wrote it
    error: str


@dataclass(frozen=True)
class ParsedReply:
    content: str  # the text before the first tool call (all of it when there is none)
    tool_calls: tuple[ToolCall, ...]
    invalid_tool_calls: tuple[InvalidToolCall, ...]


def call_id(text: str, index: int) -> str:
    """Deterministic id, so a temperature-0 reply is the same reply byte for byte."""
    return "call_" + hashlib.blake2b(f"{index}:{text}".encode(), digest_size=12).hexdigest()


def parse_tool_calls(text: str) -> ParsedReply:
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return ParsedReply(text, (), ())
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for i, m in enumerate(_BLOCK.finditer(text, start)):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError("expected a string 'name' and an object 'arguments'")
        # what a model writes is untrusted text: besides syntax errors (JSONDecodeError is a
        # ValueError), an integer past Python's 4300 digits is a ValueError and brackets
        # nested past the parser's stack a RecursionError; each is an invalid call
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            invalid.append(InvalidToolCall(body, f"{type(e).__name__}: {json_problem(e)}"))
            continue
        calls.append(ToolCall(call_id(text, i), name, args))
    if not calls and text.rfind(TOOL_CALL_OPEN) > text.rfind(TOOL_CALL_CLOSE):
        return ParsedReply(text, (), tuple(invalid))
    return ParsedReply(text[:start].rstrip(), tuple(calls), tuple(invalid))
