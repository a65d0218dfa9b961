"""`StepLoop`: one thread owns vLLM's engine (`LLMEngine`), so every admitted request is in it
at once and vLLM batches them (continuous batching); each turn submits its request and waits
on its own event.

    turn threads                      the loop thread
    ------------                      ---------------
    run(ids, sp, on_token, cancel)    (started by a run when none is; ends when idle)
      -> incoming ----------------->  add every submitted request (a cancelled one: never)
      wait on the turn's event        abort the requests whose turn was cancelled
                                      engine.step()   (all running requests, one batch)
                                      route each output by request id: new tokens to that
                                      turn's on_token, TTFT when its first token arrives;
                                      an on_token that raises aborts only its request
      <- Finished / the exception --  a finished request wakes its turn

`on_token` runs on the loop thread (it must be quick: the server's pushes to a queue), so a
turn whose `on_token` raises or sets its `cancel` is aborted before the next step. An engine
step that raises fails every request the engine held with `EngineStepFailed` (never a hang);
the loop goes on serving what is submitted after. The stand-in tests drive it with a fake
engine (tests/engines/test_vllm_loop.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from agentcache.runtime.engine import TurnCancelled


def _turn_cancelled() -> TurnCancelled:
    """A turn cancelled before it was added, or aborted before the next step."""
    return TurnCancelled("cancelled before vLLM's next engine step")


class EngineStepFailed(RuntimeError):
    """vLLM's engine raised while this request was in it; the request was aborted."""


class Finished(NamedTuple):
    """A finished request: vLLM's final output, seconds to its first token and in all, both
    from the turn's start."""

    output: Any
    ttft_s: float
    wall_s: float


@dataclass(frozen=True)
class LoopStats:
    """What the loop saw: engine steps, and the most requests in the engine at one step and
    given tokens by one step (the batch vLLM computed)."""

    steps: int = 0
    max_held: int = 0
    max_stepped: int = 0


@dataclass(eq=False)
class _Request:
    """One submitted request, owned by the loop thread once submitted."""

    ids: Sequence[int]
    sp: Any
    on_token: Callable[[int], None] | None
    cancel: threading.Event | None
    t0: float
    salt: str | None = None  # vLLM's cache_salt: its prefix cache shares blocks only within it
    rid: str = field(default_factory=lambda: f"agentcache-{uuid.uuid4().hex}")
    sent: int = 0  # output tokens already handed to on_token
    ttft: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Finished | None = None
    error: BaseException | None = None

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def end(self, result: Finished | None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class StepLoop:
    """Drives `engine` (vLLM's `LLMEngine`: `add_request`, `step`, `abort_request`,
    `has_unfinished_requests`) from one thread, started by a `run` when none is running; it
    ends when nothing is submitted or running, and at `close`. `eos_ids` are never passed to
    `on_token`."""

    def __init__(self, engine: Any, eos_ids: frozenset[int]) -> None:
        self.engine = engine
        self.eos_ids = eos_ids
        self._cond = threading.Condition()
        self._incoming: list[_Request] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        self._active: dict[str, _Request] = {}  # the loop thread's alone
        self.stats = LoopStats()

    def run(
        self,
        ids: Sequence[int],
        sp: Any,
        on_token: Callable[[int], None] | None,
        t0: float | None = None,
        cancel: threading.Event | None = None,
        salt: str | None = None,
    ) -> Finished:
        """Submit a request and wait until it finishes. Raises `TurnCancelled` when `cancel`
        is set before it is added or before any later step (it is aborted), what `on_token`
        raised (it is aborted), `EngineStepFailed`, or the engine's error adding it. `salt`:
        the request's `cache_salt` (vLLM's prefix cache shares blocks only between requests
        of the same salt; None: with every request without one)."""
        if cancel is not None and cancel.is_set():
            raise _turn_cancelled()
        t0 = time.perf_counter() if t0 is None else t0
        req = _Request(ids, sp, on_token, cancel, t0, salt)
        with self._cond:
            if self._closed:
                raise RuntimeError("the vLLM backend is closed")
            self._incoming.append(req)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="agentcache-vllm-steps", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def close(self) -> None:
        """Stop the loop: requests still in it fail; a later `run` raises."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def token_ids(self, token_ids: Any) -> tuple[int, ...]:
        """vLLM's output ids without end-of-sequence ids, as the embedded engine returns them."""
        return tuple(int(t) for t in token_ids if int(t) not in self.eos_ids)

    # ---------------------------------------------------------------- the loop thread

    def _loop(self) -> None:
        # torch's thread count is the process's, OpenMP's is each thread's own: a new thread
        # starts at OpenMP's default until torch syncs it, and vLLM's CPU attention checks the
        # count it runs with against the one its metadata was built with (`--threads`)
        torch.set_num_threads(torch.get_num_threads())
        try:
            while (incoming := self._next()) is not None:
                self._add(incoming)
                self._abort_cancelled()
                if self._active:
                    self._step()
        except BaseException as e:  # a bug here must not leave a turn waiting for ever
            with self._cond:
                self._thread = None
            message = f"agentcache's step loop failed: {e!r}"
            self._fail_all(lambda: EngineStepFailed(message))
            raise
        self._fail_all(lambda: RuntimeError("the vLLM backend was closed"))  # closed: held

    def _next(self) -> list[_Request] | None:
        """What was submitted since the last step; None: the loop ends (closed, or nothing
        submitted nor running: the next `run` starts a thread again)."""
        with self._cond:
            if self._closed or not (self._incoming or self._active):
                self._thread = None
                return None
            incoming, self._incoming = self._incoming, []
            return incoming

    def _add(self, incoming: list[_Request]) -> None:
        for req in incoming:
            if req.cancelled():  # never reaches the engine
                req.end(None, _turn_cancelled())
                continue
            try:
                prompt: dict[str, Any] = {"prompt_token_ids": list(req.ids)}
                if req.salt is not None:
                    prompt["cache_salt"] = req.salt
                self.engine.add_request(req.rid, prompt, req.sp)
            except Exception as e:  # this request's problem (too long, bad parameters)
                req.end(None, e)
                continue
            self._active[req.rid] = req

    def _abort_cancelled(self) -> None:
        gone = [r for r in self._active.values() if r.cancelled()]
        for req in gone:
            self._abort(req, _turn_cancelled())

    def _abort(self, req: _Request, error: BaseException) -> None:
        del self._active[req.rid]
        self.engine.abort_request([req.rid])
        req.end(None, error)

    def _step(self) -> None:
        held = len(self._active)
        try:
            outputs = self.engine.step()
        except Exception as e:
            self._engine_failed(e)
            return
        stepped = 0
        for out in outputs:
            req = self._active.get(out.request_id)
            if req is not None:
                stepped += 1
                self._deliver(req, out)
        s = self.stats
        self.stats = LoopStats(s.steps + 1, max(s.max_held, held), max(s.max_stepped, stepped))
        if self._active and not self.engine.has_unfinished_requests():
            for req in list(self._active.values()):  # not expected: vLLM lost them
                del self._active[req.rid]
                req.end(None, RuntimeError(f"vLLM dropped request {req.rid} unfinished"))

    def _deliver(self, req: _Request, out: Any) -> None:
        got = out.outputs[0].token_ids  # cumulative
        now = time.perf_counter()
        if req.ttft is None and len(got) > 0:
            req.ttft = now - req.t0
        new, req.sent = got[req.sent :], len(got)
        if req.on_token is not None:
            try:
                for token in self.token_ids(new):
                    req.on_token(token)
            except BaseException as e:  # the client went away: only this request ends
                if out.finished:
                    del self._active[req.rid]
                    req.end(None, e)
                else:
                    self._abort(req, e)
                return
        if out.finished:
            del self._active[req.rid]
            wall = now - req.t0
            req.end(Finished(out, req.ttft if req.ttft is not None else wall, wall))

    def _engine_failed(self, error: Exception) -> None:
        rids = list(self._active)
        with contextlib.suppress(Exception):  # broken already: its error is what turns get
            self.engine.abort_request(rids)
        for rid in rids:
            req = self._active.pop(rid)
            failed = EngineStepFailed(f"vLLM's engine step failed: {error!r}")
            failed.__cause__ = error
            req.end(None, failed)

    def _fail_all(self, error: Callable[[], BaseException]) -> None:
        with self._cond:
            waiting, self._incoming = self._incoming, []
        held, self._active = list(self._active.values()), {}
        try:
            if held:
                self.engine.abort_request([r.rid for r in held])
        finally:
            for req in [*held, *waiting]:
                req.end(None, error())
