"""How several threads share one engine: turns interleave token by token, in arrival order.

    generate A: [admit] [prefill+commit] [step] . [step] . [step] ... [reply commit] [exit]
    generate B:              [admit]  wait  [prefill+commit] [step] . [step] ... [exit]
                                             <- the engine lock, handed over in arrival order ->

`FairLock` is the engine's lock. Each unit of work (a prefill with its commit, one decode step,
the reply's commit) holds it; a thread that comes back for its next step queues behind the
threads already waiting, so running turns take steps in turn and a short request is not held
behind a long one. Each unit computes exactly what it computes alone: only the order of units
changes. With batched decode (`runtime/scheduler.py`) one step serves every running turn, so
a step (and a turn's decoder set-up and reply commit) asks the lock `first()`: it goes ahead
of the prefills waiting, one such unit after each prefill, and the running turns get a token
per waiting prefill instead of one per round of them.

With `EngineConfig.prefill_burst_tokens` = B > 0, prefills waiting may run back to back
between two such units while their costs (below) since the last one fit in B, at least one
running: prefills that arrive together (many agents starting at once, or resuming after
their tools) join the batch in fewer steps, and the running turns wait for up to B tokens of
prefill instead of one prefill per token.

With `EngineConfig.prefill_order="shortest"` (the default) the prefills waiting together go
fewest tokens to compute first (`FairLock.prefill(cost)`, the cost estimated from what the
store lacks), each passed over by at most `max_passes` others; every prefill computes what it
computes alone. `"arrival"` keeps them in arrival order.

`PageGate` admits a turn once the page pool can give it every page it will need (prompt,
max_new_tokens, the reply's closing tokens), taken as one run of slots where the pool has one,
so a running turn never finds the pool empty and its KV stays in few runs. Turns are admitted
in arrival order; a turn that waits holds no lock. A turn that needs more than the whole pool
runs when no other turn does (and then takes pages as it goes, as a lone turn always did).
With preemption (`runtime/scheduler.py`) a turn asks only for its prompt's pages, and no turn
is admitted while `hold()` says preempted turns wait to resume (`wake` when that changes).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agentcache.kv.pool import PagePool, SequenceKV


@dataclass(eq=False)
class _Waiter:
    ident: int
    first: bool  # asked `first()`
    cost: int | None  # a prefill's tokens to compute; None: another unit
    passed: int = 0  # prefills served in its place while it was first in line


class FairLock:
    """A reentrant lock handed to waiting threads in the order they asked for it, except that
    a thread asking `first()` (a batched decode step: it serves every running turn) goes
    ahead of the others once after each unit that did not: units asked `first()` and units
    in arrival order alternate while both wait, so neither starves the other.

    `shortest_first`: when the thread first in line is a prefill (`prefill(cost)`), the lock
    goes to the prefill with the fewest tokens to compute among those waiting before the first
    other unit in line (ties: the earliest), until `max_passes` prefills have gone in the place
    of the one first in line; then it goes. Other units are passed by no prefill that came
    after them. Off: costs are ignored (arrival order).

    `burst_tokens` B > 0: after a unit that did not ask `first()`, the `first()` askers wait
    while the next prefill's cost, added to the costs of the prefills run since the last
    `first()` unit, fits in B: prefills run back to back between two of them, at least one;
    other units (a page gate's look at the pool) go in a burst too, costing nothing. 0: they
    alternate, one unit after each."""

    def __init__(
        self, shortest_first: bool = False, max_passes: int = 8, burst_tokens: int = 0
    ) -> None:
        if max_passes < 0:
            raise ValueError("max_passes must be >= 0")
        if burst_tokens < 0:
            raise ValueError("burst_tokens must be >= 0")
        self.shortest_first, self.max_passes = shortest_first, max_passes
        self.burst_tokens = burst_tokens
        self._burst = 0  # prefill costs since the last `first()` unit (a burst's tokens)
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._line: deque[_Waiter] = deque()  # arrival order
        self._last_first = False  # the last holder asked first

    def acquire(self, first: bool = False, cost: int | None = None) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            entry = _Waiter(me, first, None if first else cost)
            self._line.append(entry)
            while self._owner is not None or self._next() is not entry:
                self._cond.wait()
            head = self._line[0]
            if head is not entry and self._reorders(head) and entry.cost is not None:
                head.passed += 1  # a prefill went in its place
            self._line.remove(entry)
            self._owner, self._depth = me, 1
            self._last_first = first
            if first:
                self._burst = 0
            elif entry.cost is not None:
                self._burst += entry.cost

    def _reorders(self, w: _Waiter) -> bool:
        """Whether `w` is a prefill whose place shortest-first may change."""
        return self.shortest_first and w.cost is not None

    def _next(self) -> _Waiter:
        """The waiting thread the lock goes to next."""
        if self._last_first:
            return self._ordered(list(self._line))
        others = [w for w in self._line if not w.first]
        if not others or len(others) == len(self._line):
            return self._ordered(list(self._line))
        nxt = self._ordered(others)  # what goes if the `first()` askers wait
        fits = self._burst + (nxt.cost or 0) <= self.burst_tokens
        if self.burst_tokens and self._burst < self.burst_tokens and fits:
            return nxt  # a prefill that fits in the burst, or another unit within it
        return next(w for w in self._line if w.first)

    def _ordered(self, line: list[_Waiter]) -> _Waiter:
        """The next of `line` (arrival order) when the `first()` askers in it are not put
        ahead: its head, or with shortest-first the prefill with the fewest tokens among
        those before the first other unit."""
        head = line[0]
        if not self._reorders(head) or head.passed >= self.max_passes:
            return head
        prefills = []  # the prefills before the first other unit in line: only they reorder
        for w in line:
            if w.cost is not None:
                prefills.append(w)
            elif not w.first:
                break
        return min(prefills, key=lambda w: w.cost or 0)  # min keeps the earliest of ties

    @contextmanager
    def prefill(self, cost: int) -> Iterator[FairLock]:
        """Hold the lock for a prefill of about `cost` tokens to compute (its place in line
        with `shortest_first`; arrival order otherwise)."""
        self.acquire(cost=cost)
        try:
            yield self
        finally:
            self.release()

    @contextmanager
    def first(self) -> Iterator[FairLock]:
        """Hold the lock, going ahead of the threads waiting in arrival order (once in turn)."""
        self.acquire(first=True)
        try:
            yield self
        finally:
            self.release()

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("FairLock released by a thread that does not hold it")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Threads waiting for the lock."""
        with self._cond:
            return len(self._line)

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PageGate:
    """Admits turns, in arrival order, once the pool can give each the pages it needs."""

    def __init__(self, pool: PagePool, lock: FairLock) -> None:
        self.pool, self._lock = pool, lock
        self._cond = threading.Condition(threading.Lock())
        self._line: deque[int] = deque()
        self.running = 0  # turns admitted and not yet out
        self.peak_running = 0
        self.waited = 0  # turns that found the pool short and waited for pages
        self.hold: Callable[[], bool] = lambda: False  # admit none while this holds

    def wake(self) -> None:
        """Look again at the waiting turns (`hold` may have changed)."""
        with self._cond:
            self._cond.notify_all()

    @contextmanager
    def admit(self, pages: int) -> Iterator[SequenceKV]:
        """A sequence holding `pages` pages (fewer only when they exceed the pool), freed on
        exit; waits until no earlier turn waits and the pool has them free, or no turn runs."""
        me = threading.get_ident()
        seq = SequenceKV(self.pool)
        with self._cond:
            self._line.append(me)
            counted = False
            while True:
                if self._line[0] == me and self._take(seq, pages):
                    break
                if self._line[0] == me and not counted:
                    self.waited += 1
                    counted = True
                self._cond.wait()
            self._line.popleft()
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
            self._cond.notify_all()  # the next in line may fit too
        try:
            yield seq
        finally:
            # pages and count given back at once: no turn is admitted into its pages while it
            # still counts as running (`peak_running` counts turns that held pages together)
            with self._cond, self._lock:
                seq.free()
                self.running -= 1
                self._cond.notify_all()

    def _take(self, seq: SequenceKV, pages: int) -> bool:
        with self._lock:
            if self.running == 0 or (self.pool.num_free >= pages and not self.hold()):
                seq.reserve(pages)
                return True
            return False
