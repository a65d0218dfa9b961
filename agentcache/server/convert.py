"""OpenAI request body -> ChatRequest, and ChatResult -> OpenAI response bodies."""

from __future__ import annotations

import json
from typing import Any

from agentcache.chat.logprobs import openai_content
from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.runner import ChatRequest, ChatResult
from agentcache.chat.tools import TOOL_CALL_CLOSE, forced_call_prefix
from agentcache.errors import PromptError
from agentcache.runtime.engine import GenerationParams
from agentcache.server.errors import APIError
from agentcache.server.formats import output_for, parse_format
from agentcache.server.schemas import AllowedToolsChoice, ChatCompletionRequest, ToolChoiceIn


def to_chat_request(
    body: ChatCompletionRequest, conversation: str | None, tenant: str, default_max_tokens: int
) -> tuple[ChatRequest, bool]:
    """`conversation`: the token the client echoed, if any. Returns the request and whether
    max_tokens was left to the server (then it is clamped to the context left)."""
    body = allow_tools(body)
    try:
        messages = tuple(ChatMessage.from_openai(m.model_dump()) for m in body.messages)
    except PromptError as e:
        raise APIError(400, str(e), "invalid_value", "messages") from None
    fmt = parse_format(body.response_format, "response_format", nested=True)
    check_no_reasoning(body.reasoning_effort, "reasoning_effort")
    tools = _tools(body)
    if body.tool_choice is not None and body.tool_choice != "none" and not tools:
        raise APIError(400, "tool_choice needs tools", "invalid_value", "tool_choice")
    max_tokens = (
        body.max_completion_tokens if body.max_completion_tokens is not None else (body.max_tokens)
    )
    calls = body.tool_choice != "none"  # none: the tools are shown, the reply is text
    stops = body.stop_strings()
    if calls and tools and body.parallel_tool_calls is False:
        stops = (*stops, TOOL_CALL_CLOSE)  # the first call ends the reply (tools.py parses it)
    params = GenerationParams(
        max_new_tokens=default_max_tokens if max_tokens is None else max_tokens,
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=stops,
    )  # fmt: skip
    prefill = _prefill(body, tools)
    strict = [bool(t.function.strict) for t in body.tools or ()] if tools else []
    output = output_for(fmt, tools if calls else (), strict, prefill, _forced_name(body, tools))
    request = ChatRequest(
        messages, params, tools, conversation, prefill, None, tenant, body.prompt_cache_key,
        output, _logprobs(body), tool_calls=calls,
    )  # fmt: skip
    return request, max_tokens is None


def allow_tools(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """tool_choice allowed_tools: the named tools only, offered under its mode."""
    choice = body.tool_choice
    if not isinstance(choice, AllowedToolsChoice):
        return body
    known = [t.function.name for t in body.tools or ()]
    names = [t.function.name for t in choice.allowed_tools.tools]
    for i, name in enumerate(names):
        if name not in known:
            p = f"tool_choice.allowed_tools.tools.{i}"
            raise APIError(400, f"{p}: names no tool of the request: {name[:80]!r}",
                           "invalid_value", p)  # fmt: skip
    tools = [t for t in body.tools or () if t.function.name in names]
    return body.model_copy(update={"tools": tools, "tool_choice": choice.allowed_tools.mode})


def _logprobs(body: ChatCompletionRequest) -> int | None:
    """How many top logprobs per token (0: the chosen token's only); None: none asked for."""
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs set to true", "invalid_value",
                       "top_logprobs")  # fmt: skip
    return (body.top_logprobs or 0) if body.logprobs else None


def logprobs_body(result: ChatResult, decode: Any) -> dict[str, Any] | None:
    if result.logprobs is None:
        return None
    return {"content": openai_content(result.logprobs, decode), "refusal": None}


def _forced_name(body: ChatCompletionRequest, tools: tuple[ToolSpec, ...]) -> str | None:
    if isinstance(body.tool_choice, ToolChoiceIn):
        return body.tool_choice.function.name
    return tools[0].name if body.tool_choice == "required" and len(tools) == 1 else None


def check_no_reasoning(value: Any, param: str) -> None:
    """A reasoning setting changes what a reasoning model replies; a model without reasoning
    cannot honour it, so it is refused rather than ignored."""
    if value is not None:
        raise APIError(400, f"{param}: the served model does not reason; leave {param} out",
                       "unsupported_value", param)  # fmt: skip


def _tools(body: ChatCompletionRequest) -> tuple[ToolSpec, ...]:
    """The tools the prompt shows: under tool_choice none too (as vLLM renders them), so that
    an agent's last, tool-less step extends the prompt of its tool steps."""
    if not body.tools:
        return ()
    specs = []
    for i, tool in enumerate(body.tools):
        try:
            specs.append(ToolSpec.from_openai(tool.model_dump()))
        except PromptError as e:
            raise APIError(400, f"tools[{i}]: {e}", "invalid_tool_schema", f"tools[{i}]") from None
    return tuple(specs)


def _prefill(body: ChatCompletionRequest, tools: tuple[ToolSpec, ...]) -> str | None:
    """tool_choice that forces a call starts the reply with the call's opening (see tools.py)."""
    choice = body.tool_choice
    if isinstance(choice, ToolChoiceIn):
        if choice.function.name not in {t.name for t in tools}:
            raise APIError(400, f"tool_choice names unknown tool {choice.function.name!r}",
                           "invalid_value", "tool_choice")  # fmt: skip
        return forced_call_prefix(choice.function.name)
    if choice == "required":
        return forced_call_prefix(tools[0].name if len(tools) == 1 else None)
    return None


def message_body(result: ChatResult) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        msg["content"] = result.content or None
        msg["tool_calls"] = [tool_call_body(c, i) for i, c in enumerate(result.tool_calls)]
    return msg


def tool_call_body(call: Any, index: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json()},
    }
    if index is not None:
        d["index"] = index
    return d


def usage_body(result: ChatResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.report.reused_tokens},
    }


def completion_body(
    result: ChatResult, rid: str, created: int, model: str, decode: Any = None
) -> dict[str, Any]:
    message = message_body(result)
    for call in message.get("tool_calls", ()):
        call.pop("index", None)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": result.finish_reason,
                "logprobs": logprobs_body(result, decode),
            }
        ],
        "usage": usage_body(result),
        "agentcache": result.report.to_dict(),
    }


def reuse_headers(result: ChatResult) -> dict[str, str]:
    r = result.report
    misses: dict[str, int] = {}
    for s in r.misses:
        misses[s.reason or "unknown"] = misses.get(s.reason or "unknown", 0) + 1
    return {
        "X-Agentcache-Conversation": r.conversation_id,  # a token the server issued: ASCII
        "X-Agentcache-Prompt-Tokens": str(r.prompt_tokens),
        "X-Agentcache-Reused-Tokens": str(r.reused_tokens),
        "X-Agentcache-Recomputed-Tokens": str(r.recomputed_tokens),
        "X-Agentcache-TTFT-Ms": f"{r.ttft_s * 1000:.1f}",
        "X-Agentcache-Misses": ",".join(f"{k}:{v}" for k, v in sorted(misses.items())),
    }


def chunk(
    rid: str, created: int, model: str, delta: dict[str, Any] | None, finish: str | None = None,
    logprobs: dict[str, Any] | None = None, **extra: Any,
) -> str:  # fmt: skip
    """One SSE event; `delta=None` sends `choices: []` (the usage chunk)."""
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    ]  # fmt: skip
    body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, **extra}  # fmt: skip
    return sse(body)


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
