"""Tokenizing one request under the tokenizing budget (admission.py `Budget`), given up when
its client leaves:

    take the budget's characters (503 when they do not fit)
      -> wait for a worker thread -> tokenize -> release
            \\__ client gone: not started yet -> never starts; characters released at once
                             started -> the handler answers at once (499); the characters
                             are released when the tokenizer call returns (it cannot be
                             stopped, and the memory it holds is in use until then)

A request whose client left never reaches the admission line, so it holds no queued tokens.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from agentcache.server.admission import Budget
from agentcache.server.turns import watch

T = TypeVar("T")


class ClientLeft(Exception):
    """The client left before its request was tokenized."""


class Abandonable:
    """`work()` for a worker thread, which does nothing once abandoned before it started."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        self._lock = threading.Lock()
        self._state = "new"  # -> "running" or "abandoned"

    def __call__(self) -> object:
        with self._lock:
            if self._state == "abandoned":
                raise ClientLeft
            self._state = "running"
        return self._work()

    def abandon(self) -> bool:
        """True when the work had not started (it never will now)."""
        with self._lock:
            if self._state == "new":
                self._state = "abandoned"
            return self._state == "abandoned"


async def tokenize_held(
    budget: Budget, tenant: str, chars: int, work: Callable[[], T], request: Request | None,
    run: Callable[[Callable[[], object]], Awaitable[object]] = run_in_threadpool,
) -> T:  # fmt: skip
    """`work()` in a worker thread (`run`), holding `chars` of `budget` for `tenant`; raises
    QueueFull when they do not fit, ClientLeft when the client left first (see the module
    docstring for when the characters come back)."""
    release = budget.take(tenant, chars)
    job = Abandonable(work)
    task = asyncio.ensure_future(run(job))
    why = None
    try:
        why = await watch(task, request, math.inf, threading.Event())
    finally:
        if task.done():
            release()
        else:  # the client left, or the handler was cancelled
            task.add_done_callback(_seen)
            if job.abandon():
                release()
            else:
                task.add_done_callback(lambda _: release())
    if why is not None:
        raise ClientLeft
    return task.result()  # type: ignore[return-value]


def _seen(task: asyncio.Future[object]) -> None:
    """A given-up task's outcome counts as retrieved (ClientLeft, or a result no one reads)."""
    if not task.cancelled():
        task.exception()
