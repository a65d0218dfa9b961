"""Requests take turns at the engine in arrival order, with a bounded line.

    take()  -> a Ticket, or QueueFull when `max_queued` requests wait already (-> 503)
    turn    -> done when every ticket taken before it was released
    release -> the next ticket's turn (a ticket released before its turn leaves the line)

A plain lock hands the engine to whichever waiting thread the OS wakes; tickets keep the order
requests came in, so a request waits for those before it only.
"""

from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    """`max_queued` requests are waiting already."""


class Ticket:
    def __init__(self, line: AdmissionLine, turn: asyncio.Future[None]) -> None:
        self._line, self._turn, self._released = line, turn, False

    @property
    def turn(self) -> asyncio.Future[None]:
        """Done when it is this ticket's turn (await it through `asyncio.wait` or shield it:
        cancelling it would lose the turn)."""
        return self._turn

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._line._leave(self._turn)


class AdmissionLine:
    """One per app, used from its event loop only (no locks needed)."""

    def __init__(self, max_queued: int) -> None:
        if max_queued < 0:
            raise ValueError("max_queued must be >= 0")
        self.max_queued = max_queued
        self._line: deque[asyncio.Future[None]] = deque()  # the first one is being served

    @property
    def waiting(self) -> int:
        return max(0, len(self._line) - 1)

    @property
    def full(self) -> bool:
        return bool(self._line) and self.waiting >= self.max_queued

    def take(self) -> Ticket:
        if self.full:
            raise QueueFull
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        if len(self._line) == 1:
            turn.set_result(None)
        return Ticket(self, turn)

    def _leave(self, turn: asyncio.Future[None]) -> None:
        served = bool(self._line) and self._line[0] is turn
        self._line.remove(turn)
        if served and self._line:
            self._line[0].set_result(None)
