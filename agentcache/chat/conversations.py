"""The conversations a tracker remembers, for reporting: which message each one sent last at
every index, so a message that replaced another reads `changed`. Bounded in bytes.

A request continues a conversation only when it carries that conversation's token and the
token verifies (`ConversationTokens`); the server hands a token only to the request that
created the conversation, in its response. Any other request starts a conversation of its own
(a client string is never an id), so no client can obtain or take over another's.

A request's `prompt_cache_key` (OpenAI's field) names a group of its tenant's requests: the
last request + reply of the group stands in for a conversation's when the request carries no
token, so a client that echoes nothing still gets `changed` labels. Groups are for reports
only: reuse never depends on a group or a conversation (the store is keyed by content within
the tenant), and a group hands out no token.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from agentcache.chat.identity import ConversationTokens, digest

ENTRY_BYTES = 120  # one remembered fingerprint: a 16-char str, its list slot
STATE_BYTES = 400  # an entry's list object and its dict slot


@dataclass(frozen=True)
class Conversation:
    """The conversation a request belongs to."""

    id: str  # random, issued by the server
    token: str  # what the client echoes (X-Agentcache-Conversation)
    tenant: str
    echoed: bool = False  # the request carried this conversation's valid token
    rejected_token: bool = False  # the request carried a token that did not verify

    @property
    def scope(self) -> str:
        return f"conv-{self.id}"


def group_key(tenant: str, cache_key: str) -> str:
    """The book's name for a tenant's `prompt_cache_key` group (never a conversation id)."""
    return "group-" + digest("group", tenant, cache_key)


class ConversationBook:
    """Thread-safe; least recently used entries (conversations and groups) are forgotten beyond
    `max_conversations` or `max_bytes` (estimated: `STATE_BYTES + ENTRY_BYTES` per message)."""

    def __init__(
        self, tokens: ConversationTokens, max_conversations: int, max_messages: int, max_bytes: int
    ) -> None:
        if min(max_conversations, max_messages, max_bytes) < 1:
            raise ValueError("max_conversations, max_messages and max_bytes must be >= 1")
        self.tokens = tokens
        self.max_conversations, self.max_messages, self.max_bytes = (
            max_conversations, max_messages, max_bytes,
        )  # fmt: skip
        self._last: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._last)

    def resolve(
        self, token: str | None, tenant: str, group: str | None = None
    ) -> tuple[Conversation, tuple[str, ...]]:
        """The request's conversation, and the fingerprints of the last request + reply that
        its labels compare with: its conversation's, else its group's, else none."""
        cid = self.tokens.verify(token, tenant) if token else None
        if cid is not None:
            conv = Conversation(cid, str(token), tenant, echoed=True)
        else:
            new_id, new_token = self.tokens.issue(tenant)
            conv = Conversation(new_id, new_token, tenant, rejected_token=bool(token))
        with self._lock:
            last = self._last.get(conv.id) if cid is not None else None
            if last is None and group is not None:
                last = self._last.get(group)
        return conv, last or ()

    def record(self, conv: Conversation, last: Sequence[str], group: str | None = None) -> None:
        """After a turn: `last` (its request + reply) is what the conversation, and its group,
        sent last."""
        kept = tuple(last[: self.max_messages])  # index-aligned: labels compare by index
        with self._lock:
            for key in (conv.id, group):
                if key is not None:
                    self._put(key, kept)
            self._evict()

    def _put(self, key: str, last: tuple[str, ...]) -> None:
        old = self._last.pop(key, None)
        if old is not None:
            self._bytes -= _nbytes(old)
        self._last[key] = last
        self._bytes += _nbytes(last)

    def _evict(self) -> None:
        while len(self._last) > 1 and (
            len(self._last) > self.max_conversations or self._bytes > self.max_bytes
        ):
            _, last = self._last.popitem(last=False)
            self._bytes -= _nbytes(last)


def _nbytes(last: tuple[str, ...]) -> int:
    return STATE_BYTES + ENTRY_BYTES * len(last)
