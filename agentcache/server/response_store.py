"""What `POST /v1/responses` keeps for `previous_response_id`: each stored response's whole
conversation (its input messages and its reply), owned by one tenant, for a while.

    id -> (tenant, messages, conversation token, bytes, expiry)

Bounded three ways: `max_responses` entries, `max_bytes` of message text (oldest evicted
first), and `ttl_s` seconds each. A lookup by another tenant, of an expired or evicted id, or
of one never stored, is the same miss: the caller cannot tell another tenant's id from none.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agentcache.chat.messages import ChatMessage


@dataclass(frozen=True)
class StoredResponse:
    tenant: str
    messages: tuple[ChatMessage, ...]  # input (without instructions), then the reply
    conversation: str  # the conversation token the turn was reported under
    nbytes: int
    expires: float


def message_bytes(messages: tuple[ChatMessage, ...]) -> int:
    total = 0
    for m in messages:
        total += len(m.content.encode()) + 64  # 64: a message's fixed cost, roughly
        total += sum(len(c.name) + len(c.arguments_json()) for c in m.tool_calls)
    return total


class ResponseStore:
    def __init__(
        self, max_responses: int, max_bytes: int, ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.max_responses, self.max_bytes, self.ttl_s = max_responses, max_bytes, ttl_s
        self._clock = clock
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.evicted = 0  # entries dropped for room (not for age)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, tenant: str, messages: tuple[ChatMessage, ...], token: str) -> bool:
        """Keep `messages` under `rid`; False when one response alone exceeds `max_bytes`."""
        size = message_bytes(messages)
        if size > self.max_bytes or self.max_responses <= 0:
            return False
        with self._lock:
            self._expire()
            while self._items and (
                len(self._items) >= self.max_responses or self.nbytes + size > self.max_bytes
            ):
                _, old = self._items.popitem(last=False)
                self.nbytes -= old.nbytes
                self.evicted += 1
            self._items[rid] = StoredResponse(
                tenant, messages, token, size, self._clock() + self.ttl_s
            )
            self.nbytes += size
        return True

    def get(self, rid: str, tenant: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            item = self._items.get(rid)
        return item if item is not None and item.tenant == tenant else None

    def _expire(self) -> None:
        now = self._clock()
        while self._items:
            rid, oldest = next(iter(self._items.items()))
            if oldest.expires > now:
                break
            del self._items[rid]
            self.nbytes -= oldest.nbytes
