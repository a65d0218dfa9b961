"""The conversations a tracker remembers, which one a request belongs to, bounded in bytes.

A request continues a conversation when
- it carries a token that verifies (`ConversationTokens`): the conversation the token names;
- or it carries none (or one that does not verify) and its message list begins with exactly
  the last request + reply of one conversation of its tenant (their chain hashes match),
  unless that conversation's client ever echoed its token (then only the token continues it)
  or several conversations ended the same way (then none does).
Otherwise it starts a new conversation with a fresh id. A client string is never an id.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agentcache.chat.identity import ConversationTokens, digest

ENTRY_BYTES = 120  # one remembered fingerprint: a 16-char str, its set and list slots
STATE_BYTES = 640  # a conversation's state object, its dict entries, its chain entry


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


@dataclass
class ConversationState:
    seen: set[str] = field(default_factory=set)  # fingerprints / shared keys it has sent
    last: list[str] = field(default_factory=list)  # fingerprints of the last request + reply
    chain: str | None = None  # chain hash of the last request + reply
    echoed: bool = False

    @property
    def nbytes(self) -> int:
        return STATE_BYTES + ENTRY_BYTES * (len(self.seen) + len(self.last))


def chain_hashes(tenant: str, fingerprints: Sequence[str]) -> list[str]:
    """The chain hash of every prefix of a message list, from the empty one on."""
    hashes = [digest("chain", tenant)]
    for fp in fingerprints:
        hashes.append(digest(hashes[-1], fp))
    return hashes


class ConversationBook:
    """Thread-safe; least recently used conversations are forgotten beyond `max_conversations`
    or `max_bytes` (estimated: `ConversationState.nbytes`)."""

    def __init__(
        self, tokens: ConversationTokens, max_conversations: int, max_seen: int, max_bytes: int
    ) -> None:
        if min(max_conversations, max_seen, max_bytes) < 1:
            raise ValueError("max_conversations, max_seen and max_bytes must be >= 1")
        self.tokens = tokens
        self.max_conversations, self.max_seen, self.max_bytes = (
            max_conversations, max_seen, max_bytes,
        )  # fmt: skip
        self._states: OrderedDict[str, ConversationState] = OrderedDict()
        self._chains: dict[str, str] = {}  # chain hash -> the conversation that ended so
        self._ambiguous: OrderedDict[str, None] = OrderedDict()  # ended so by several
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._states)

    def resolve(
        self, token: str | None, tenant: str, fingerprints: Sequence[str]
    ) -> tuple[Conversation, set[str], list[str]]:
        """The request's conversation, and a copy of what it has seen and its last request."""
        cid = self.tokens.verify(token, tenant) if token else None
        with self._lock:
            if cid is not None:
                conv = Conversation(cid, str(token), tenant, echoed=True)
            elif (found := self._continued(tenant, fingerprints)) is not None:
                conv = Conversation(found, self.tokens.sign(found, tenant), tenant,
                                    rejected_token=bool(token))  # fmt: skip
            else:
                new_id, new_token = self.tokens.issue(tenant)
                conv = Conversation(new_id, new_token, tenant, rejected_token=bool(token))
            state = self._states.get(conv.id)
            seen, last = (set(state.seen), list(state.last)) if state else (set(), [])
        return conv, seen, last

    def _continued(self, tenant: str, fingerprints: Sequence[str]) -> str | None:
        for h in reversed(chain_hashes(tenant, fingerprints)[1:]):
            if h in self._ambiguous:
                return None
            cid = self._chains.get(h)
            if cid is not None:
                state = self._states.get(cid)
                return None if state is None or state.echoed else cid
        return None

    def record(self, conv: Conversation, sent: Iterable[str], last: list[str], chain: str) -> None:
        """After a turn: `sent` (its messages, shared keys and reply) count as seen, `last` and
        `chain` describe its request + reply."""
        with self._lock:
            state = self._states.pop(conv.id, None)
            if state is None:
                state = ConversationState()
            else:
                self._bytes -= state.nbytes
                self._forget_chain(conv.id, state)
            state.seen.update(sent)
            if len(state.seen) > self.max_seen:  # keep what the latest request still uses
                state.seen = set(sent)
            state.last, state.chain = last, chain
            state.echoed = state.echoed or conv.echoed
            self._register_chain(conv.id, chain)
            self._states[conv.id] = state
            self._bytes += state.nbytes
            self._evict()

    def _register_chain(self, cid: str, chain: str) -> None:
        other = self._chains.get(chain)
        if chain in self._ambiguous or (other is not None and other != cid):
            self._chains.pop(chain, None)
            self._ambiguous[chain] = None
            while len(self._ambiguous) > self.max_conversations:
                self._ambiguous.popitem(last=False)
        else:
            self._chains[chain] = cid

    def _forget_chain(self, cid: str, state: ConversationState) -> None:
        if state.chain is not None and self._chains.get(state.chain) == cid:
            del self._chains[state.chain]

    def _evict(self) -> None:
        while len(self._states) > 1 and (
            len(self._states) > self.max_conversations or self._bytes > self.max_bytes
        ):
            cid, state = self._states.popitem(last=False)
            self._bytes -= state.nbytes
            self._forget_chain(cid, state)
