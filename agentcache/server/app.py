"""The ASGI app: /v1/chat/completions (JSON and SSE), /v1/models, /health, /metrics.

Generation runs in worker threads; the engine serializes requests under its lock, so
concurrent conversations interleave by request and never share a sequence. The engine is any
`ServingEngine`: the embedded `Engine` or vLLM (`agentcache serve --backend vllm`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from agentcache.chat.runner import ChatEngine, ChatResult, PreparedChat
from agentcache.chat.segmenter import ConversationTracker
from agentcache.errors import AgentCacheError, ContextLengthError, OutOfPagesError, PromptError
from agentcache.runtime.backends import ServingEngine
from agentcache.server.convert import (
    chunk,
    completion_body,
    message_body,
    reuse_headers,
    sse,
    to_chat_request,
    usage_body,
)
from agentcache.server.errors import APIError, on_api_error, on_http_error, on_validation_error
from agentcache.server.metrics import ServerMetrics
from agentcache.server.schemas import ChatCompletionRequest

CONVERSATION_HEADER = "X-Agentcache-Conversation"
ENDPOINTS = ("/v1/chat/completions", "/v1/models", "/health", "/metrics")


@dataclass(frozen=True)
class ServerConfig:
    model_name: str  # the name clients pass as `model`
    default_max_tokens: int = 256  # when a request sets none (clamped to the context left)
    isolate_conversations: bool = True  # reuse only a conversation's own history (+ system)

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must be non-empty")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")


class _Cancelled(Exception):
    """The streaming client went away; generation stops at the next token."""


def api_error(e: AgentCacheError) -> APIError:
    if isinstance(e, ContextLengthError):
        return APIError(400, str(e), "context_length_exceeded", "max_tokens")
    if isinstance(e, PromptError):
        return APIError(400, str(e), "invalid_value", "messages")
    if isinstance(e, OutOfPagesError):
        return APIError(503, str(e), "server_overloaded", None, "server_error")
    return APIError(500, str(e), "internal_error", None, "server_error")


def create_app(engine: ServingEngine, config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig(engine.model_id.split("#", 1)[0])
    chat = ChatEngine(engine, ConversationTracker(isolate=config.isolate_conversations))
    metrics = ServerMetrics(engine.store_bytes)
    app = FastAPI(title="agentcache", version="0.1.0")
    app.state.chat = chat
    app.state.metrics = metrics
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)

    @app.middleware("http")
    async def count_requests(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        path = request.url.path if request.url.path in ENDPOINTS else "other"
        metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": config.model_name}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "agentcache"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def completions(
        body: ChatCompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        if body.model != config.model_name:
            raise APIError(404, f"model {body.model!r} not found; this server serves "
                           f"{config.model_name!r}", "model_not_found", "model")  # fmt: skip
        conversation = request.headers.get(CONVERSATION_HEADER)
        req, clamp = to_chat_request(body, conversation, config.default_max_tokens)
        try:
            prepared = await run_in_threadpool(chat.prepare, req, clamp)
        except AgentCacheError as e:
            raise api_error(e) from None
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _stream(chat, metrics, prepared, rid, created, body.model, include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        try:
            result = await run_in_threadpool(chat.run, prepared)
        except AgentCacheError as e:
            raise api_error(e) from None
        metrics.record_turn(result.report, result.completion_tokens)
        return JSONResponse(
            completion_body(result, rid, created, body.model), headers=reuse_headers(result)
        )

    return app


async def _stream(
    chat: ChatEngine,
    metrics: ServerMetrics,
    prepared: PreparedChat,
    rid: str,
    created: int,
    model: str,
    include_usage: bool,
) -> AsyncIterator[str]:
    """SSE chunks: role, content pieces, tool calls, the finish chunk (with the `agentcache`
    report), optionally usage, then [DONE]. An error after the first chunk is sent as an
    `error` event, since the status line is already out."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    gone = threading.Event()

    def on_text(piece: str) -> None:
        if gone.is_set():
            raise _Cancelled
        loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

    def work() -> None:
        try:
            outcome: tuple[str, Any] = ("done", chat.run(prepared, on_text))
        except BaseException as e:  # handed to the event loop, re-raised or reported there
            outcome = ("error", e)
        loop.call_soon_threadsafe(queue.put_nowait, outcome)

    worker = loop.run_in_executor(None, work)
    try:
        yield chunk(rid, created, model, {"role": "assistant", "content": ""}, None)
        while True:
            kind, item = await queue.get()
            if kind == "text":
                if item:
                    yield chunk(rid, created, model, {"content": item}, None)
                continue
            if kind == "error":
                err = api_error(item) if isinstance(item, AgentCacheError) else APIError(
                    500, f"{type(item).__name__}: {item}", "internal_error", None, "server_error"
                )  # fmt: skip
                yield sse(err.body())
                break
            result: ChatResult = item
            metrics.record_turn(result.report, result.completion_tokens)
            if result.stream_mismatch:
                metrics.stream_mismatches.inc()
            if result.tool_calls:
                calls = message_body(result)["tool_calls"]
                yield chunk(rid, created, model, {"tool_calls": calls}, None)
            yield chunk(rid, created, model, {}, result.finish_reason,
                        agentcache=result.report.to_dict())  # fmt: skip
            if include_usage:
                yield chunk(rid, created, model, None, usage=usage_body(result))
            yield "data: [DONE]\n\n"
            break
    finally:
        gone.set()
        await worker
