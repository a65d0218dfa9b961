"""Requests take turns at the engine in arrival order, `max_active` at a time, with a bounded
line.

    take()  -> a Ticket, or QueueFull when `max_queued` requests wait already (-> 503)
    turn    -> done when fewer than `max_active` tickets taken before it are still held
    release -> the next waiting ticket's turn (a ticket released before its turn leaves the line)

A plain lock hands the engine to whichever waiting thread the OS wakes; tickets keep the order
requests came in, so a request waits for those before it only. The embedded engine interleaves
the active turns token by token (`runtime/sharing.py`), so a short request is not held behind a
long one; `max_active` = 1 serves requests one after the other.
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

    def __init__(self, max_queued: int, max_active: int = 1) -> None:
        if max_queued < 0 or max_active < 1:
            raise ValueError("max_queued must be >= 0 and max_active >= 1")
        self.max_queued, self.max_active = max_queued, max_active
        self._line: deque[asyncio.Future[None]] = deque()  # the first max_active are served

    @property
    def active(self) -> int:
        """Tickets being served (at the engine)."""
        return min(len(self._line), self.max_active)

    @property
    def waiting(self) -> int:
        return max(0, len(self._line) - self.max_active)

    @property
    def full(self) -> bool:
        return len(self._line) >= self.max_active and self.waiting >= self.max_queued

    def take(self) -> Ticket:
        if self.full:
            raise QueueFull
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        if len(self._line) <= self.max_active:
            turn.set_result(None)
        return Ticket(self, turn)

    def _leave(self, turn: asyncio.Future[None]) -> None:
        self._line.remove(turn)
        if len(self._line) >= self.max_active and not self._line[self.max_active - 1].done():
            self._line[self.max_active - 1].set_result(None)
