"""The ASGI app: /v1/chat/completions, /v1/responses and /v1/messages (JSON and SSE),
/v1/messages/count_tokens, /v1/models, /health, /metrics.

Requests take turns at the engine in arrival order, `max_active` at a time (admission.py), each
generating in a worker thread that stops within a token when its client leaves or its deadline
passes (turns.py); the embedded engine interleaves the active ones token by token.
The engine is any `ServingEngine`: the embedded `Engine` or vLLM (`serve --backend vllm`).
Layers in front of the routes (middleware.py): response counting, Host and API key checks,
body size and JSON depth.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from agentcache.backends import ServingEngine
from agentcache.chat.identity import tenant_id
from agentcache.chat.retention import TurnRetention
from agentcache.chat.runner import ChatEngine, ChatRequest, ChatResult, PreparedChat
from agentcache.chat.segmenter import ConversationTracker
from agentcache.errors import AgentCacheError
from agentcache.server.admission import AdmissionLine, Budget, QueueFull
from agentcache.server.cache_control import openai_cache_controls
from agentcache.server.config import ServerConfig
from agentcache.server.convert import chunk, completion_body, reuse_headers, to_chat_request
from agentcache.server.errors import (
    APIError,
    api_error,
    on_api_error,
    on_http_error,
    on_validation_error,
)
from agentcache.server.heap import HeapTrimmer
from agentcache.server.limits import check_request, check_tools, prompt_chars
from agentcache.server.messages_api import message_body, message_id, to_turn
from agentcache.server.messages_schema import CountTokensRequest, MessagesRequest
from agentcache.server.messages_stream import MessagesEmitter
from agentcache.server.metrics import (
    ServerMetrics,
    batch_stats,
    engine_preemptions,
    pool_pages,
    tier_store,
)
from agentcache.server.middleware import BodyLimit, CountResponses, Gatekeeper
from agentcache.server.response_store import ResponseStore
from agentcache.server.responses import ResponseIds, ResponsesEmitter, response_body
from agentcache.server.responses import to_chat_request as responses_request
from agentcache.server.responses_schema import ResponsesRequest
from agentcache.server.schemas import ChatCompletionRequest
from agentcache.server.tokenizing import ClientLeft, tokenize_held
from agentcache.server.turns import (
    ChatEmitter,
    Emitter,
    Turn,
    complete,
    overloaded,
    stream,
)

T = TypeVar("T")
# the content parts an OpenAI prompt_cache_breakpoint may sit on, per API
CHAT_PARTS = frozenset({"text"})
RESPONSES_PARTS = frozenset({"input_text"})
CONVERSATION_HEADER = "X-Agentcache-Conversation"
CLIENT_GONE = 499  # the status recorded (and sent to no one) when the client left


def create_app(engine: ServingEngine, config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig(engine.model_id.split("#", 1)[0])
    tracker = ConversationTracker(
        isolate=config.isolate_conversations, max_bytes=config.tracker_bytes,
        secret=config.conversation_secret,
    )  # fmt: skip
    kept_turns = TurnRetention(engine, config.retention)
    chat = ChatEngine(engine, tracker, kept_turns)
    line = AdmissionLine(config.max_queued, config.max_active, config.max_queued_tokens,
                         config.tenant_slots, config.max_active_tokens,
                         config.prefix_block_tokens)  # fmt: skip
    tokenizing = Budget(config.max_tokenizing_chars)
    book = tracker.book
    metrics = ServerMetrics(
        engine.store_bytes, lambda: (line.active, line.waiting, line.active_tokens),
        lambda: (book.nbytes, len(book)),
        lambda: (line.waiting_tokens, tokenizing.in_flight), lambda: batch_stats(engine),
        kept_turns, tier_store(engine), lambda: engine_preemptions(engine),
        lambda: pool_pages(engine),
    )  # fmt: skip
    docs = config.enable_docs
    stored = ResponseStore(config.max_stored_responses, config.stored_response_bytes,
                           config.stored_response_ttl_s)  # fmt: skip
    # a ticket is released once its worker has stopped, so the line's capacity in threads
    # (max_active, and the slots kept for other tenants once more) always suffices
    workers = ThreadPoolExecutor(line.capacity, thread_name_prefix="agentcache-turn")
    trimmer = HeapTrimmer(config.trim_interval_s) if config.trim_interval_s > 0 else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if trimmer is not None:
            trimmer.start()
        yield
        workers.shutdown(wait=False, cancel_futures=True)
        if trimmer is not None:
            trimmer.stop()

    app = FastAPI(
        title="agentcache", version="0.1.0", lifespan=lifespan, docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None,
    )  # fmt: skip
    app.state.chat, app.state.metrics = chat, metrics
    app.state.line, app.state.trimmer, app.state.responses = line, trimmer, stored
    app.state.tokenizing = tokenizing
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_middleware(BodyLimit, limits=config.limits)  # the last added runs first
    app.add_middleware(Gatekeeper, allowed_hosts=config.allowed_hosts,
                       key_digests=config.api_key_digests,
                       metrics_digests=config.metrics_key_digests)  # fmt: skip
    app.add_middleware(CountResponses, metrics=metrics)

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

    def check_model(model: str) -> None:
        if model != config.model_name:
            raise APIError(404, f"model {model[:200]!r} not found; this server serves "
                           f"{config.model_name!r}", "model_not_found", "model")  # fmt: skip

    def streamed(turn: Turn, emitter: Emitter) -> Response:
        """The turn as server-sent events, each written by `emitter` (the API's shape)."""
        why = line.refusal(turn.tenant, turn.tokens, turn.reserve, turn.blocks)
        if why is not None:  # else the line is checked again when the stream starts
            raise overloaded(why)
        return StreamingResponse(
            stream(turn, metrics, emitter),
            media_type="text/event-stream",
            headers={CONVERSATION_HEADER: turn.prepared.chat.conversation_id},
        )

    async def tokenized(
        work: Callable[..., T], req: ChatRequest, request: Request, *args: Any
    ) -> T:  # fmt: skip
        """`work(req, *args)` (which tokenizes `req`) in a worker thread, the request's size
        bounded first: tools by --max-tool-chars (contents were checked by each API), and
        the characters being tokenized at once by --max-tokenizing-chars (503 beyond). A
        client that leaves meanwhile gets CLIENT_GONE at once (server/tokenizing.py)."""
        check_tools(req.tools, config.limits)
        call = functools.partial(work, req, *args)
        try:
            return await tokenize_held(tokenizing, req.tenant, prompt_chars(req), call, request)
        except QueueFull as e:
            raise overloaded(str(e)) from None
        except ClientLeft:
            metrics.cancelled.inc()
            raise APIError(CLIENT_GONE, "the client left while its request was being "
                           "tokenized", "client_gone") from None  # fmt: skip
        except AgentCacheError as e:
            raise api_error(e) from None

    async def prepare(req: ChatRequest, request: Request, clamp: bool) -> PreparedChat:
        return await tokenized(chat.prepare, req, request, clamp)

    async def finished(turn: Turn, request: Request) -> ChatResult | None:
        """The turn's result, counted in the metrics; None when its client left."""
        result = await complete(turn, request)
        if result is None:
            metrics.cancelled.inc()
        else:
            metrics.record_turn(result)
        return result

    @app.post("/v1/chat/completions", response_model=None)
    async def completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        check_request(body, config.limits)
        tenant = tenant_id(getattr(request.state, "key_digest", None), body.cache_salt)
        token = request.headers.get(CONVERSATION_HEADER)
        req, clamp = to_chat_request(body, token, tenant, config.default_max_tokens)
        kept = openai_cache_controls(
            [m.model_dump() for m in body.messages], "messages", CHAT_PARTS,
            body.prompt_cache_retention, body.prompt_cache_options, config.max_retention_s,
        )  # fmt: skip
        req = replace(req, retention_s=kept.granted_s)
        prepared = await prepare(req, request, clamp)
        if prepared.chat.conversation.rejected_token:
            metrics.rejected_tokens.inc()
        turn = Turn(chat, line, prepared, config.request_timeout_s, threading.Event(), workers)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            send = functools.partial(chunk, rid, created, body.model)
            emitter = ChatEmitter(send, include_usage, kept, engine.tokenizer.decode)
            return streamed(turn, emitter)
        result = await finished(turn, request)
        if result is None:
            return Response(status_code=CLIENT_GONE)
        body_out = completion_body(result, rid, created, body.model, engine.tokenizer.decode)
        body_out["agentcache"]["cache_control"] = kept.to_dict(result.retention)
        return JSONResponse(body_out, headers=reuse_headers(result))

    @app.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        check_model(body.model)
        tenant = tenant_id(getattr(request.state, "key_digest", None), body.cache_salt)
        history: tuple[Any, ...] = ()
        token = request.headers.get(CONVERSATION_HEADER)
        if body.previous_response_id is not None:
            previous = stored.get(body.previous_response_id, tenant)
            if previous is None:
                raise APIError(404, f"previous_response_id {body.previous_response_id[:128]!r} "
                               "not found (never stored, expired, or evicted)", "not_found",
                               "previous_response_id")  # fmt: skip
            history, token = previous.messages, previous.conversation
        req, turn_messages, clamp = responses_request(
            body, history, token, tenant, config.default_max_tokens, config.limits
        )
        kept = openai_cache_controls(
            body.input if isinstance(body.input, list) else (), "input", RESPONSES_PARTS,
            body.prompt_cache_retention, body.prompt_cache_options, config.max_retention_s,
        )  # fmt: skip
        req = replace(req, retention_s=kept.granted_s)
        try:
            prepared = await prepare(req, request, clamp)
        except APIError as err:
            # this API's names for them
            err.param = {"max_tokens": "max_output_tokens", "messages": "input"}.get(
                err.param or "", err.param
            )
            raise
        if prepared.chat.conversation.rejected_token:
            metrics.rejected_tokens.inc()
        turn = Turn(chat, line, prepared, config.request_timeout_s, threading.Event(), workers)
        ids, created = ResponseIds(), int(time.time())

        def keep(result: Any) -> None:
            if body.store:
                messages = (*turn_messages, result.message())
                stored.put(ids.rid, tenant, messages, result.report.conversation_id)

        if body.stream:
            emitter = ResponsesEmitter(body, ids, created, keep, kept,
                                       engine.tokenizer.decode)  # fmt: skip
            return streamed(turn, emitter)
        result = await finished(turn, request)
        if result is None:
            return Response(status_code=CLIENT_GONE)
        keep(result)
        out = response_body(body, ids, created, result, kept, engine.tokenizer.decode)
        return JSONResponse(out, headers=reuse_headers(result))

    @app.post("/v1/messages", response_model=None)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        check_model(body.model)
        tenant = tenant_id(getattr(request.state, "key_digest", None), body.cache_salt)
        token = request.headers.get(CONVERSATION_HEADER)
        turn_in = to_turn(body, token, tenant, config.limits, config.max_retention_s)
        prepared = await prepare(turn_in.request, request, False)
        if prepared.chat.conversation.rejected_token:
            metrics.rejected_tokens.inc()
        turn = Turn(chat, line, prepared, config.request_timeout_s, threading.Event(), workers)
        mid = message_id()
        if body.stream:
            n = prepared.tokens.num_tokens
            return streamed(turn, MessagesEmitter(body.model, mid, turn_in, n))
        result = await finished(turn, request)
        if result is None:
            return Response(status_code=CLIENT_GONE)
        return JSONResponse(message_body(body, mid, result, turn_in),
                            headers=reuse_headers(result))  # fmt: skip

    @app.post("/v1/messages/count_tokens", response_model=None)
    async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
        """Anthropic's token count: the prompt's tokens as /v1/messages would prefill them
        (`input_tokens + cache_read_input_tokens + cache_creation_input_tokens` there)."""
        check_model(body.model)
        tenant = tenant_id(getattr(request.state, "key_digest", None), body.cache_salt)
        turn_in = to_turn(body, None, tenant, config.limits, config.max_retention_s)
        return {"input_tokens": await tokenized(chat.count_tokens, turn_in.request, request)}

    return app
