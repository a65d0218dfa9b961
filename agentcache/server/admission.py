"""Requests take turns at the engine, `max_active` at a time (and, where the engine does not
admit by its own KV pages, at most `max_active_tokens` tokens at a time), with a line bounded
by requests and by prompt tokens, shared fairly between tenants.

    take(tenant, tokens, reserve)
                         -> a Ticket, or QueueFull (-> 503) when the line has no room for it
    turn                 -> done when the ticket is served (at the engine)
    release              -> a served ticket's slot goes to the next waiting one; a ticket
                            released before its turn leaves the line

Fairness between tenants (an API key + cache_salt, chat/identity.py):

- A free slot goes to the waiting tenant with the fewest tickets at the engine, ties to the one
  served longest ago; within a tenant, tickets keep their arrival order. A tenant with 20
  requests in line makes another tenant's request wait for one slot to free, not for all 20.
- While other tenants have requests at the engine or in line, one tenant holds at most
  `tenant_slots` of the `max_active` slots (by default all of them); the others stay free for
  other tenants, so another tenant's request starts at once even while one tenant's long
  requests fill the engine (interleaved, they would all end at about the same time: waiting
  for "one slot to free" would be waiting for all of them).
- A tenant alone at the engine and in line may hold every slot and token: the share kept
  for others is not held idle. When another tenant's request arrives, that tenant's first
  ticket at the engine is served over the bounds by what the lone tenant holds beyond its
  share (at most the part kept for others, so the engine holds at most `capacity` tickets
  and the bound plus that part in tokens), and the tenant that held more waits for its share
  again before its next ticket: the newcomer starts at once, as if the part had been kept.
- The line holds at most `max_queued` requests and `max_queued_tokens` prompt tokens. When a
  request does not fit, it takes the place of the newest waiting ticket of the tenant holding
  the largest share of the line (by requests or tokens, whichever is larger), as long as that
  tenant's share stays larger than the arriving tenant's would be; that ticket's turn fails
  with QueueFull (-> 503). So one tenant can fill the line only while no one else waits, and a
  request of a tenant holding less than another is never refused for lack of room.
- `max_active_tokens` (the vLLM backend: its KV cache, in tokens): a ticket `reserve`s the
  tokens it may hold at the engine (prompt + max_tokens) and is served only when they fit
  beside the active tickets' (a ticket alone is served whatever its size), one tenant's at
  most its share of them (`tenant_slots / max_active`) while others have tickets. Whole
  blocks of prompt prefix that active tickets share (`reuse.prefix.block_chain`: the same
  tokens from the first, in blocks of `block_tokens`, within one tenant and cache salt) count
  once, as the engine's prefix cache holds them once: requests that open with the same system
  prompt and tools reserve those tokens once. The next ticket is chosen as above; while it
  does not fit, every ticket waits behind it (a long prompt is not passed over for ever by
  short ones), except that a tenant's first request still goes first when it is the fair
  choice and fits.

A plain lock hands the engine to whichever waiting thread the OS wakes; tickets keep the order
above. The embedded engine interleaves the active turns token by token (`runtime/sharing.py`),
so a short request is not held behind a long one; `max_active` = 1 serves requests one after
the other.

`Budget` bounds the characters being tokenized at once (before a request has tokens to queue
by), with the same rule: a tenant with something in flight may hold at most half of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


class QueueFull(Exception):
    """No room in the line (or the ticket was pushed out of it); the message says why."""


@dataclass
class _Held:
    """Tokens active tickets hold at the engine: each one's reserve, with the prefix blocks
    they share counted once (`blocks`: how many active tickets hold each key)."""

    rest: int = 0  # the reserves less their whole prefix blocks
    blocks: Counter[str] = field(default_factory=Counter)

    def tokens(self, block: int) -> int:
        return self.rest + len(self.blocks) * block

    def added(self, reserve: int, keys: tuple[str, ...], block: int) -> int:
        """What a ticket of `reserve` tokens with prefix blocks `keys` would add."""
        return reserve - block * sum(1 for k in keys if k in self.blocks)

    def add(self, ticket: Ticket, block: int) -> None:
        self.rest += ticket.reserve - block * len(ticket.blocks)
        self.blocks.update(ticket.blocks)

    def remove(self, ticket: Ticket, block: int) -> None:
        self.rest -= ticket.reserve - block * len(ticket.blocks)
        for k in ticket.blocks:
            self.blocks[k] -= 1
            if not self.blocks[k]:
                del self.blocks[k]


class Ticket:
    def __init__(self, line: AdmissionLine, turn: asyncio.Future[None], tenant: str,
                 tokens: int, reserve: int, blocks: tuple[str, ...] = ()) -> None:  # fmt: skip
        self._line, self._turn = line, turn
        self.tenant, self.tokens, self.reserve = tenant, tokens, reserve
        self.blocks = blocks  # its prompt's prefix blocks (`reuse.prefix.block_chain`)
        self.state = "waiting"  # -> "active" -> "gone"; "pushed" when pushed out of the line

    @property
    def turn(self) -> asyncio.Future[None]:
        """Done when it is this ticket's turn, or with QueueFull when it was pushed out of the
        line (await it through `asyncio.wait` or shield it: cancelling it would lose the turn)."""
        return self._turn

    def release(self) -> None:
        if self._turn.done() and not self._turn.cancelled():
            self._turn.exception()  # a pushed-out turn's QueueFull counts as seen
        self._line._leave(self)


@dataclass
class _Tenant:
    waiting: deque[Ticket] = field(default_factory=deque)
    active: int = 0
    held: _Held = field(default_factory=_Held)  # the reserves of its active tickets
    waiting_tokens: int = 0
    last_served: int = 0  # the line's count of tickets served when this tenant was last


def _fair_order(t: _Tenant) -> tuple[int, int]:
    """Who is served first: fewest tickets at the engine, then served longest ago."""
    return (t.active, t.last_served)


class AdmissionLine:
    """One per app, used from its event loop only (no locks needed)."""

    def __init__(
        self, max_queued: int, max_active: int = 1, max_queued_tokens: int | None = None,
        tenant_slots: int | None = None, max_active_tokens: int | None = None,
        block_tokens: int | None = None,
    ) -> None:  # fmt: skip
        if max_queued < 0 or max_active < 1:
            raise ValueError("max_queued must be >= 0 and max_active >= 1")
        if tenant_slots is not None and not 1 <= tenant_slots <= max_active:
            raise ValueError("tenant_slots must be in [1, max_active]")
        # slots one tenant may hold: the rest stay free for other tenants' requests
        self.tenant_slots = max_active if tenant_slots is None else tenant_slots
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError("max_queued_tokens must be >= 1")
        if max_active_tokens is not None and max_active_tokens < 1:
            raise ValueError("max_active_tokens must be >= 1")
        self.max_queued, self.max_active = max_queued, max_active
        self.max_queued_tokens = max_queued_tokens
        self.max_active_tokens = max_active_tokens
        if block_tokens is not None and block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        # tokens per prefix block tickets may share (`block_chain`); None: none shared
        self.block_tokens = block_tokens
        self._block = block_tokens or 0
        # tokens one tenant may hold at the engine: its share of the slots, of the tokens
        self.tenant_tokens = (
            None if max_active_tokens is None
            else max(1, max_active_tokens * self.tenant_slots // max_active)
        )  # fmt: skip
        self._tenants: dict[str, _Tenant] = {}
        self._active = self._waiting = self._waiting_tokens = self._served = 0
        self._held = _Held()

    @property
    def capacity(self) -> int:
        """The most tickets ever at the engine at once: `max_active`, and the slots kept for
        other tenants once more (a newcomer's first ticket, while a lone tenant held them)."""
        return 2 * self.max_active - self.tenant_slots

    @property
    def active(self) -> int:
        """Tickets being served (at the engine)."""
        return self._active

    @property
    def active_tokens(self) -> int:
        """The reserves of the tickets being served, shared prefix blocks counted once."""
        return self._held.tokens(self._block)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def waiting_tokens(self) -> int:
        """Prompt tokens of the waiting tickets."""
        return self._waiting_tokens

    def waiting_of(self, tenant: str) -> tuple[int, int]:
        """(requests, prompt tokens) `tenant` has waiting."""
        t = self._tenants.get(tenant)
        return (len(t.waiting), t.waiting_tokens) if t is not None else (0, 0)

    def refusal(self, tenant: str, tokens: int, reserve: int | None = None,
                blocks: tuple[str, ...] = ()) -> str | None:  # fmt: skip
        """Why `take(tenant, tokens, reserve, blocks)` would raise QueueFull, or None when it
        would not."""
        reserve = tokens if reserve is None else reserve
        if self._serves_now(tenant, reserve, self._blocks_of(reserve, blocks)):
            return None
        return self._room(tenant, tokens, push=False)

    def take(self, tenant: str = "", tokens: int = 0, reserve: int | None = None,
             blocks: tuple[str, ...] = ()) -> Ticket:  # fmt: skip
        """A ticket for a request of `tokens` prompt tokens (what it adds to the line) that
        may hold `reserve` tokens at the engine (default: `tokens`), the first of them in
        prefix `blocks` (`reuse.prefix.block_chain` of its prompt, in the line's
        `block_tokens`)."""
        reserve = tokens if reserve is None else reserve
        blocks = self._blocks_of(reserve, blocks)
        loop = asyncio.get_running_loop()
        now = self._serves_now(tenant, reserve, blocks)
        if not now and (why := self._room(tenant, tokens, push=True)) is not None:
            raise QueueFull(why)
        ticket = Ticket(self, loop.create_future(), tenant, tokens, reserve, blocks)
        t = self._tenants.setdefault(tenant, _Tenant())
        if now:
            self._serve(ticket, t)
        else:
            t.waiting.append(ticket)
            t.waiting_tokens += tokens
            self._waiting += 1
            self._waiting_tokens += tokens
            self._dispatch()  # a ticket pushed out may have been the one that did not fit
        return ticket

    def _blocks_of(self, reserve: int, blocks: tuple[str, ...]) -> tuple[str, ...]:
        """`blocks`, checked: shared blocks need the line's `block_tokens`, and fit the reserve."""
        if not blocks:
            return ()
        if self.block_tokens is None:
            raise ValueError("prefix blocks given to a line without block_tokens")
        if len(blocks) * self.block_tokens > reserve:
            raise ValueError(f"{len(blocks)} prefix blocks of {self.block_tokens} tokens "
                             f"exceed the reserve of {reserve}")  # fmt: skip
        return tuple(blocks)

    def _serves_now(self, tenant: str, reserve: int, blocks: tuple[str, ...] = ()) -> bool:
        """A slot (and room for `reserve` tokens) is free, `tenant` is under its share and has
        nothing waiting, and no waiting ticket is the fairer choice (without a token bound,
        whoever waits while a slot is free is a tenant at its slots: `_dispatch`)."""
        t = self._tenants.get(tenant)
        if t is not None and t.waiting:
            return False
        if not (self._eligible(t, reserve, blocks) and self._room_for(t, reserve, blocks)):
            return False
        mine = (0, 0) if t is None else _fair_order(t)
        return not any(_fair_order(o) <= mine for o in self._candidates())

    def _candidates(self) -> list[_Tenant]:
        """The tenants whose next waiting ticket is within their share."""
        return [t for t in self._tenants.values() if t.waiting
                and self._eligible(t, t.waiting[0].reserve, t.waiting[0].blocks)]  # fmt: skip

    def _eligible(self, t: _Tenant | None, reserve: int, blocks: tuple[str, ...] = ()) -> bool:
        """Whether a ticket of `reserve` tokens (prefix `blocks`) of tenant `t` is within the
        tenant's share (a tenant alone at the engine and in line: any ticket)."""
        if t is None or t.active == 0 or len(self._tenants) == 1:
            return True  # (a tenant with a ticket at the engine is in `_tenants`)
        if t.active >= self.tenant_slots:
            return False
        bound = self.tenant_tokens
        b = self._block
        return bound is None or t.held.tokens(b) + t.held.added(reserve, blocks, b) <= bound

    def _room_for(self, t: _Tenant | None, reserve: int, blocks: tuple[str, ...] = ()) -> bool:
        """A free slot, and room for `reserve` tokens (prefix `blocks`, those an active ticket
        holds already counted once) beside the active tickets' (a ticket alone at the engine
        always has room). Tenant `t`'s first ticket at the engine has the room other tenants
        hold beyond their share besides (taken while they were alone)."""
        slots, bound, b = self.max_active, self.max_active_tokens, self._block
        if t is None or t.active == 0:
            over_slots, over_tokens = self._over_share()
            slots += over_slots
            bound = None if bound is None else bound + over_tokens
        if self._active >= slots:
            return False
        if bound is None or self._active == 0:
            return True
        return self._held.tokens(b) + self._held.added(reserve, blocks, b) <= bound

    def _over_share(self) -> tuple[int, int]:
        """(slots, tokens) the tenants at the engine hold beyond their share."""
        slots = tokens = 0
        for o in self._tenants.values():
            slots += max(0, o.active - self.tenant_slots)
            if self.tenant_tokens is not None:
                tokens += max(0, o.held.tokens(self._block) - self.tenant_tokens)
        return slots, tokens

    def _fits(self, waiting: int, tokens: int) -> bool:
        """Whether one more request fits behind `waiting` ones, all of them `tokens` tokens
        (a request alone in line fits whatever its tokens: the pool's bound is checked first)."""
        if waiting >= self.max_queued:
            return False
        bound = self.max_queued_tokens
        return bound is None or waiting == 0 or tokens <= bound

    def _share(self, requests: int, tokens: int) -> float:
        """The part of the line `requests` waiting requests of `tokens` tokens take."""
        share = requests / self.max_queued if self.max_queued else float(requests > 0)
        if self.max_queued_tokens is not None:
            share = max(share, tokens / self.max_queued_tokens)
        return share

    def _room(self, tenant: str, tokens: int, push: bool) -> str | None:
        """None when a request of `tenant` with `tokens` fits in the line, once tickets of
        tenants holding more of it are pushed out (only when `push`); else why not."""
        pushed: list[Ticket] = []
        held = {name: [len(t.waiting), t.waiting_tokens] for name, t in self._tenants.items()}
        waiting, waiting_tokens = self._waiting, self._waiting_tokens
        mine = held.get(tenant, [0, 0])
        mine_after = self._share(mine[0] + 1, mine[1] + tokens)
        while not self._fits(waiting, waiting_tokens + tokens):
            others = [(self._share(*h), n) for n, h in held.items() if n != tenant and h[0]]
            if not others:
                return self._why_full(tenant)
            share, name = max(others)
            if share <= mine_after:
                return self._why_full(tenant)
            victim = self._tenants[name].waiting[held[name][0] - 1]
            pushed.append(victim)
            held[name][0] -= 1
            held[name][1] -= victim.tokens
            waiting, waiting_tokens = waiting - 1, waiting_tokens - victim.tokens
        if push:
            for victim in pushed:
                self._push_out(victim)
        return None

    def _why_full(self, tenant: str) -> str:
        n, tokens = self.waiting_of(tenant)
        bounds = f"--max-queued {self.max_queued}"
        if self.max_queued_tokens is not None:
            bounds += f" requests, --max-queued-tokens {self.max_queued_tokens} prompt tokens"
        return (
            f"{self._waiting} requests of {self._waiting_tokens} prompt tokens are waiting, "
            f"{n} of them ({tokens} tokens) this tenant's (the line's bounds: {bounds})"
        )

    def _push_out(self, ticket: Ticket) -> None:
        self._unqueue(ticket)
        ticket.state = "pushed"
        ticket.turn.set_exception(QueueFull(
            "pushed out of the line by another tenant's request: this tenant held the largest "
            "share of the waiting requests (--max-queued, --max-queued-tokens)"
        ))  # fmt: skip

    def _unqueue(self, ticket: Ticket) -> None:
        t = self._tenants[ticket.tenant]
        t.waiting.remove(ticket)
        t.waiting_tokens -= ticket.tokens
        self._waiting -= 1
        self._waiting_tokens -= ticket.tokens
        self._forget(ticket.tenant)

    def _forget(self, tenant: str) -> None:
        t = self._tenants.get(tenant)
        if t is not None and not t.waiting and t.active == 0:
            del self._tenants[tenant]

    def _serve(self, ticket: Ticket, t: _Tenant) -> None:
        ticket.state = "active"
        t.active += 1
        t.held.add(ticket, self._block)
        self._active += 1
        self._held.add(ticket, self._block)
        self._served += 1
        t.last_served = self._served
        ticket.turn.set_result(None)

    def _leave(self, ticket: Ticket) -> None:
        if ticket.state == "waiting":
            self._unqueue(ticket)
        elif ticket.state == "active":
            t = self._tenants[ticket.tenant]
            t.active -= 1
            t.held.remove(ticket, self._block)
            self._active -= 1
            self._held.remove(ticket, self._block)
            self._forget(ticket.tenant)
        ticket.state = "gone"
        self._dispatch()

    def _dispatch(self) -> None:
        """Serve the fair choice among the waiting tickets while it fits."""
        while self._waiting:  # (a free slot: `_room_for`, with a newcomer's over the bound)
            eligible = self._candidates()
            if not eligible:
                break
            t = min(eligible, key=_fair_order)
            if not self._room_for(t, t.waiting[0].reserve, t.waiting[0].blocks):
                break  # the others wait behind it: it is not passed over
            head = t.waiting.popleft()
            t.waiting_tokens -= head.tokens
            self._waiting -= 1
            self._waiting_tokens -= head.tokens
            self._serve(head, t)


class Budget:
    """Characters being tokenized at once, at most `limit`; a request of a tenant that has
    something in flight fits while that tenant holds at most half of it. A request alone is
    always let through (the request limits bound its size)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.in_flight = 0
        self._by_tenant: dict[str, int] = {}

    def take(self, tenant: str, chars: int) -> Callable[[], None]:
        """Hold `chars` for `tenant`; returns their release (a second call does nothing).
        Raises QueueFull when they do not fit."""
        mine = self._by_tenant.get(tenant, 0)
        if self.in_flight and (
            self.in_flight + chars > self.limit or (mine and mine + chars > self.limit // 2)
        ):
            raise QueueFull(
                f"{self.in_flight} characters are being tokenized, {mine} of them this "
                f"tenant's (at most --max-tokenizing-chars {self.limit} at once, a tenant's at "
                "most half of that)"
            )
        self.in_flight += chars
        self._by_tenant[tenant] = mine + chars
        held = [chars]

        def release() -> None:
            if held:
                self._give_back(tenant, held.pop())

        return release

    @contextlib.contextmanager
    def hold(self, tenant: str, chars: int) -> Iterator[None]:
        """`take` for the length of a block."""
        release = self.take(tenant, chars)
        try:
            yield
        finally:
            release()

    def of(self, tenant: str) -> int:
        """Characters `tenant` has being tokenized."""
        return self._by_tenant.get(tenant, 0)

    def _give_back(self, tenant: str, chars: int) -> None:
        self.in_flight -= chars
        left = self._by_tenant[tenant] - chars
        if left:
            self._by_tenant[tenant] = left
        else:
            del self._by_tenant[tenant]
