"""One request's turn at the engine: wait in line, generate in a worker thread, stop early.

    take a ticket (503 when the line is full) -> wait for its turn -> generate -> release
                                        \\___ client gone / deadline: cancel event set ___/

Generation stops within a token of the cancel event being set (`ChatEngine.run`), a prefill
the engine runs in chunks before its next chunk (`ServingEngine.generate`); the ticket is
released once the worker has stopped, so no more than the line's `capacity` requests are
ever at the engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from starlette.requests import Request

from agentcache.chat.runner import ChatEngine, ChatResult, PreparedChat
from agentcache.errors import AgentCacheError
from agentcache.reuse.prefix import block_chain, chain_scope
from agentcache.server.admission import AdmissionLine, QueueFull, Ticket
from agentcache.server.cache_control import Retention
from agentcache.server.convert import logprobs_body, message_body, sse, usage_body
from agentcache.server.errors import APIError, api_error, internal_error
from agentcache.server.metrics import ServerMetrics

POLL_S = 0.1  # how often a waiting non-streaming request checks that its client is there
RETRY_AFTER_S = 5


def overloaded(why: str) -> APIError:
    msg = f"the server is busy: {why}; retry later"
    return APIError(503, msg, "server_overloaded", None, "server_error",
                    {"Retry-After": str(RETRY_AFTER_S)})  # fmt: skip


def timed_out(timeout_s: float) -> APIError:
    msg = (
        f"the request did not finish within the server's deadline (--request-timeout {timeout_s:g})"
    )
    return APIError(504, msg, "timeout", None, "server_error")


@dataclass
class Turn:
    """What one request needs to take its turn."""

    chat: ChatEngine
    line: AdmissionLine
    prepared: PreparedChat
    timeout_s: float
    cancel: threading.Event
    workers: Executor  # one thread per active ticket (the line's max_active)

    @property
    def tenant(self) -> str:
        return self.prepared.request.tenant

    @property
    def tokens(self) -> int:
        """The prompt's tokens: what the request adds to the line's waiting work."""
        return self.prepared.tokens.num_tokens

    @property
    def reserve(self) -> int:
        """The tokens it may hold at the engine: prompt + max_tokens."""
        return self.tokens + self.prepared.request.params.max_new_tokens

    @cached_property
    def blocks(self) -> tuple[str, ...]:
        """Its prompt's whole prefix blocks in the engine's prefix cache (`block_chain`),
        where the line counts shared ones once; () where it does not. Keyed by the tenant and
        the scope vLLM's cache is salted with (`engines.vllm.driver.prompt_salt`), so the line
        counts a block shared only where vLLM shares it."""
        size = self.line.block_tokens
        if size is None or self.line.max_active_tokens is None:
            return ()
        tokens = self.prepared.tokens
        scope = f"{self.tenant}\x00{chain_scope(tokens) or ''}"
        return tuple(block_chain(tokens.ids, size, scope))

    def take(self) -> Ticket:
        """A ticket in the line; APIError 503 when there is no room for it."""
        try:
            return self.line.take(self.tenant, self.tokens, self.reserve, self.blocks)
        except QueueFull as e:
            raise overloaded(str(e)) from None

    def start(self, on_text: Callable[[str], None] | None = None) -> asyncio.Future[ChatResult]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.workers, self.chat.run, self.prepared, on_text,
                                    self.cancel)  # fmt: skip


async def watch(fut: asyncio.Future[Any], request: Request | None, deadline: float,
                cancel: threading.Event) -> str | None:  # fmt: skip
    """Wait for `fut`: None once done, "gone" when the client left first, "timeout" at the
    deadline (the cancel event is then set)."""
    loop = asyncio.get_running_loop()
    while True:
        left = deadline - loop.time()
        if left <= 0:
            cancel.set()
            return "timeout"
        done, _ = await asyncio.wait({fut}, timeout=min(POLL_S, left))
        if done:
            return None
        if request is not None and await request.is_disconnected():
            cancel.set()
            return "gone"


def release_when_done(worker: asyncio.Future[Any] | None, release: Callable[[], None]) -> None:
    """Release the ticket once the worker has stopped; its outcome counts as retrieved (a
    cancelled generation's `GenerationCancelled` or `TurnCancelled` is expected, not an
    unhandled error)."""

    def done(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled():
            fut.exception()
        release()

    if worker is None:
        release()
    else:
        worker.add_done_callback(done)


async def complete(turn: Turn, request: Request) -> ChatResult | None:
    """The result, or None when the client left. Raises APIError (504 at the deadline, 503
    when the line is full, the engine's errors). A client gone already takes no ticket."""
    if await request.is_disconnected():
        return None
    ticket = turn.take()
    deadline = asyncio.get_running_loop().time() + turn.timeout_s
    worker = None
    try:
        why = await watch(ticket.turn, request, deadline, turn.cancel)
        if why is None and (pushed := ticket.turn.exception()) is not None:
            raise overloaded(str(pushed))
        if why is None:
            worker = turn.start()
            why = await watch(worker, request, deadline, turn.cancel)
    finally:
        turn.cancel.set()  # no-op for a finished worker; stops one whose client left
        release_when_done(worker, ticket.release)
    if why == "timeout":
        raise timed_out(turn.timeout_s)
    if why == "gone":
        return None
    assert worker is not None
    try:
        return worker.result()
    except AgentCacheError as e:
        raise api_error(e) from None


class Emitter(Protocol):
    """The SSE events of one API's stream."""

    def start(self) -> Iterator[str]: ...

    def text(self, piece: str) -> Iterator[str]: ...

    def finish(self, result: ChatResult) -> Iterator[str]: ...

    def error(self, err: APIError) -> str: ...


async def stream(turn: Turn, metrics: ServerMetrics, emit: Emitter) -> AsyncIterator[str]:
    """SSE events of one turn: `emit`'s opening events, its events for each content piece and
    for the finished result. An error after the first event is `emit.error` (the status line
    is out)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    worker: asyncio.Future[ChatResult] | None = None

    def on_text(piece: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

    def done(fut: asyncio.Future[ChatResult]) -> None:
        queue.put_nowait(("done", fut))

    for event in emit.start():
        yield event
    try:
        ticket = turn.take()
    except APIError as e:
        yield emit.error(e)
        return
    deadline = loop.time() + turn.timeout_s
    answered = False  # the stream ran to its end (a reply or an error event)
    try:
        if await watch(ticket.turn, None, deadline, turn.cancel) is not None:
            answered = True
            yield emit.error(timed_out(turn.timeout_s))
            return
        if (pushed := ticket.turn.exception()) is not None:
            answered = True
            yield emit.error(overloaded(str(pushed)))
            return
        worker = turn.start(on_text)
        worker.add_done_callback(done)
        while True:
            try:
                kind, item = await asyncio.wait_for(queue.get(), deadline - loop.time())
            except TimeoutError:
                turn.cancel.set()
                answered = True
                yield emit.error(timed_out(turn.timeout_s))
                return
            if kind == "text":
                if item:
                    for event in emit.text(item):
                        yield event
                continue
            answered = True
            try:
                result: ChatResult = item.result()
            except AgentCacheError as e:
                yield emit.error(api_error(e))
                return
            except Exception as e:  # a bug: reported in the stream, then counted as a 500
                yield emit.error(internal_error(e))
                raise
            metrics.record_turn(result)
            if result.stream_mismatch:
                metrics.stream_mismatches.inc()
            for event in emit.finish(result):
                yield event
            return
    finally:
        turn.cancel.set()  # a client that left stops generation at the next token
        if not answered:
            metrics.cancelled.inc()
        release_when_done(worker, ticket.release)


@dataclass(frozen=True)
class ChatEmitter:
    """Chat completion chunks (`send(delta, finish, **extra)` makes one): the role, content
    pieces, tool calls, the finish chunk (with the `agentcache` report), optionally usage,
    then [DONE]."""

    send: Callable[..., str]
    include_usage: bool
    cache_control: Retention | None = None  # the request's cache controls (cache_control.py)
    decode: Callable[..., str] | None = None  # token ids -> text, for logprobs

    def start(self) -> Iterator[str]:
        yield self.send({"role": "assistant", "content": ""}, None)

    def text(self, piece: str) -> Iterator[str]:
        yield self.send({"content": piece}, None)

    def finish(self, result: ChatResult) -> Iterator[str]:
        if result.tool_calls:
            yield self.send({"tool_calls": message_body(result)["tool_calls"]}, None)
        report = result.report.to_dict()
        if self.cache_control is not None:
            report["cache_control"] = self.cache_control.to_dict(result.retention)
        # logprobs, when asked for, come whole with the finish chunk
        lp = logprobs_body(result, self.decode)
        yield self.send({}, result.finish_reason, lp, agentcache=report)
        if self.include_usage:
            yield self.send(None, usage=usage_body(result))
        yield "data: [DONE]\n\n"

    def error(self, err: APIError) -> str:
        return sse(err.body())
