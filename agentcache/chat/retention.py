"""Keeping a conversation's KV across a tool pause (the chat front's side of kv/retention.py).

    request arrives -- begin: does it resend a tool-call message a turn of its tenant ended
                       in (or echo that turn's conversation token)? then the pause's gap is
                       observed (GapLearner) and what it retained is prefetched to the fast
                       tier (tiered store)
    turn ends ------- end: the request asked for retention (a cache control), or the turn
                       ended in a tool call -> every entry the turn's prompt and reply may be
                       stored under is retained in the store for the asked time (granted up
                       to the cap) or the learned one; a resumed pause kept for the learned
                       time is released (what this turn retains again stays pinned); one
                       kept for an asked time stays until it ends

Pins name entries by content id, and a chat segment's content id carries its scope (the
tenant's, its conversation's, or a prefix scope that names the tenant: chat/segmenter.py), so
a tenant's pins protect, and its report counts, only its own entries.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from agentcache.backends import ServingEngine
from agentcache.chat.messages import ChatMessage
from agentcache.chat.segmenter import ChatPrompt, fingerprint, message_text
from agentcache.kv.retention import GapLearner, PauseBook, RetainingStore, RetentionConfig
from agentcache.kv.store import (
    SegmentStore,
    context_copy_id,
    exact_copy_id,
    segment_content_id,
)
from agentcache.prompt.reply import close_reply
from agentcache.prompt.segments import Segment
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.prefix import block_chain, chain_scope
from agentcache.reuse.promptcache import NAMESPACE as AT_START
from agentcache.reuse.segments import chain_ids
from agentcache.runtime.engine import Engine


def stored_ids(prompt: TokenizedPrompt, page_size: int) -> list[str]:
    """Every content id a strategy may store a turn of `prompt` under: each segment's first
    copy (anywhere, and at its start for `promptcache`), its exact and context copies for this
    context, and the prompt's prefix blocks. Each id carries the segment's scope."""
    chain = chain_ids(prompt)
    out = []
    for i, seg in enumerate(prompt.segments):
        scope = seg.segment.scope
        out += [
            segment_content_id(seg.ids, scope),
            segment_content_id(seg.ids, scope, AT_START, seg.start),
            exact_copy_id(chain[i + 1], scope, seg.start),
            context_copy_id(chain[i + 1], scope, seg.start),
        ]
    out += block_chain(prompt.ids, page_size, chain_scope(prompt))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Held:
    """What a pause retained: entries of one model and tokenizer."""

    model_id: str
    tokenizer_id: str
    cids: tuple[str, ...]
    tool_call: bool  # the turn ended in a tool call (its gap teaches the learner)
    learned: bool  # kept for the learned time: released when its conversation goes on


@dataclass(frozen=True)
class Resumed:
    gap_s: float  # since the pause's turn ended
    held: Held
    prefetched_pages: int


@dataclass(frozen=True)
class RetentionReport:
    """One turn's retention, as the server reports it (`agentcache.cache_control`)."""

    requested_s: float | None  # what the request asked for (None: nothing)
    granted_s: float | None  # retained for (None: nothing retained)
    source: str  # "request", "learned" (a tool call's, from observed gaps) or "none"
    enforced: bool  # the store pins entries (False: the backend's store cannot)
    pinned_segments: int  # entries of this turn pinned (its own scope's only)
    pinned_bytes: int
    refused_segments: int  # held but beyond the retained share or the tenant's: not pinned
    resumed_after_s: float | None  # this request resumed a tool pause that long after it
    prefetched_pages: int  # pages of the resumed pause moved up to the fast tier
    tenant_refused_segments: int = 0  # of refused_segments, those over the tenant's part

    def to_dict(self) -> dict[str, Any]:
        return {"retention_source": self.source, "retained_ttl_s": self.granted_s,
                "enforced": self.enforced and self.granted_s is not None,
                "pinned_segments": self.pinned_segments,
                "pinned_bytes": self.pinned_bytes, "refused_segments": self.refused_segments,
                "tenant_refused_segments": self.tenant_refused_segments,
                "resumed_after_s": self.resumed_after_s,
                "prefetched_pages": self.prefetched_pages}  # fmt: skip


class TurnRetention:
    """Retention for the turns of one `ChatEngine`; see the module docstring. Thread-safe.
    `clock`: seconds, what gaps are measured on (the store's own clock expires its pins).
    The store's retained share is set to `config.pinned_share` when it can pin (a share of 0
    turns pinning off: reports say `enforced` false, as on a store that cannot pin), and a
    tenant's part of it to `config.tenant_share` and its reservation to `config.reserve`
    (pins are owned by their tenant). Each tenant
    learns its own default from its own pauses (`learner` is the empty one each starts from;
    the `max_tenants` most recent are remembered), so no tenant's traffic shows in another's."""

    def __init__(
        self, engine: ServingEngine, config: RetentionConfig | None = None,
        clock: Callable[[], float] = time.monotonic, learner: GapLearner | None = None,
        max_pauses: int = 4096, max_tenants: int = 1024,
    ) -> None:  # fmt: skip
        self.config = config or RetentionConfig()
        self.clock = clock
        self._learner = learner or GapLearner(self.config)  # each tenant's starts as a copy
        self._learners: OrderedDict[str, GapLearner] = OrderedDict()
        self.max_tenants = max_tenants
        self.pauses: PauseBook[Held] = PauseBook(max_pauses)
        self._lock = threading.Lock()
        self._engine = engine if isinstance(engine, Engine) else None
        # what a turn stored: the embedded engine's ids (below), or a backend's own
        # (`retained_ids`, with its `retention_store`: the vLLM backend's shared folder)
        self._ids: Callable[[TokenizedPrompt, Segment], tuple[str, str, list[str]]] | None
        store: object
        if self._engine is not None:
            store, self._ids = self._engine.store, self._engine_ids
        else:
            store = getattr(engine, "retention_store", None)
            self._ids = getattr(engine, "retained_ids", None)
        can_pin = self.config.pinned_share > 0 and self._ids is not None
        # a share of 0: retention off
        self.store = store if can_pin and isinstance(store, RetainingStore) else None
        if self.store is not None:
            c = self.config
            self.store.set_retain_share(c.pinned_share, c.tenant_share, c.reserve)

    def default_s(self, tenant: str) -> float:
        """The retention a tool-call turn of `tenant` gets without a request: learned from
        the tenant's pauses, capped."""
        with self._lock:
            return self._learned(tenant).retention_s()

    def _learned(self, tenant: str) -> GapLearner:
        learner = self._learners.get(tenant)
        if learner is None:
            learner = self._learners[tenant] = copy.deepcopy(self._learner)
            while len(self._learners) > self.max_tenants:
                self._learners.popitem(last=False)
        self._learners.move_to_end(tenant)
        return learner

    def begin(self, chat: ChatPrompt, tenant: str) -> Resumed | None:
        """A request arrived: the tool pause it resumes, if any (its gap observed, its
        segments prefetched)."""
        keys: list[tuple[str, str]] = [(tenant, fp) for fp in reversed(chat.fingerprints)]
        if chat.conversation.echoed:
            keys.insert(0, (tenant, "conversation:" + chat.conversation.id))
        with self._lock:
            got = self.pauses.resume(keys, self.clock())
            if got is None:
                return None
            gap, held = got
            if held.tool_call:
                self._learned(tenant).observe(gap)
        prefetch = getattr(self.store, "prefetch", None)
        moved = prefetch(held.model_id, held.tokenizer_id, held.cids) if prefetch else 0
        return Resumed(gap, held, moved)

    def end(
        self, prepared_chat: ChatPrompt, tokens: TokenizedPrompt, tenant: str,
        reply: ChatMessage, reply_segment: Segment, requested_s: float | None,
        resumed: Resumed | None,
    ) -> RetentionReport:  # fmt: skip
        """After a turn: retain what it stored when asked (`requested_s`, already granted up
        to the cap) or when its reply is a tool call; release the pause it resumed."""
        tool_call = bool(reply.tool_calls)
        if requested_s is not None:
            seconds, source = min(requested_s, self.config.max_s), "request"
        elif tool_call:
            seconds, source = self.default_s(tenant), "learned"
        else:
            seconds, source = None, "none"
        pinned, nbytes, refused, over_share = 0, 0, 0, 0
        held: Held | None = None
        if seconds is not None and self.store is not None:
            held = self._held(tokens, reply_segment, tool_call, source == "learned")
            got = self.store.retain(held.model_id, held.tokenizer_id, held.cids, seconds, tenant)
            pinned, nbytes, refused = len(got.pinned), got.nbytes, len(got.refused)
            over_share = len(got.owner_refused)
        if resumed is not None and resumed.held.learned and self.store is not None:
            again = set(held.cids) if held is not None else set()
            old = resumed.held
            gone = [c for c in old.cids if c not in again]
            self.store.release(old.model_id, old.tokenizer_id, gone)
        if seconds is not None:
            self._pause(prepared_chat, tenant, reply, held, tool_call, source == "learned")
        return RetentionReport(
            requested_s, seconds, source, self.store is not None,
            pinned, nbytes, refused,
            None if resumed is None else resumed.gap_s,
            0 if resumed is None else resumed.prefetched_pages, over_share,
        )  # fmt: skip

    def _held(
        self, tokens: TokenizedPrompt, reply_segment: Segment, tool_call: bool, learned: bool
    ) -> Held:
        """The entries of this turn the store holds (the ids the engine may store it under)."""
        assert self._ids is not None and self.store is not None
        model_id, tokenizer_id, ids = self._ids(tokens, reply_segment)
        store = cast(SegmentStore, self.store)
        held = [c for c in dict.fromkeys(ids)
                if store.contains_content(model_id, tokenizer_id, c)]  # fmt: skip
        return Held(model_id, tokenizer_id, tuple(held), tool_call, learned)

    def _engine_ids(
        self, tokens: TokenizedPrompt, reply_segment: Segment
    ) -> tuple[str, str, list[str]]:
        """The embedded engine's: the prompt's and, closed in place of the generation prompt,
        the reply's (as `Engine.generate` stores them)."""
        engine = self._engine
        assert engine is not None
        page = engine.config.page_size
        ids = stored_ids(tokens, page)
        full = close_reply(tokens, reply_segment, engine.tokenizer, engine.model.chat_format)
        if full is not None:
            ids += stored_ids(full, page)
        return engine.model_id, engine.tokenizer.tokenizer_id, ids

    def _pause(
        self, chat: ChatPrompt, tenant: str, reply: ChatMessage, held: Held | None,
        tool_call: bool, learned: bool,
    ) -> None:  # fmt: skip
        """Remember the pause under the conversation and, for a tool call, the call's
        fingerprint (what the next request resends), both within the tenant."""
        keys = [(tenant, "conversation:" + chat.conversation.id)]
        if tool_call:
            keys.append((tenant, fingerprint(reply.chat_role, message_text(reply))))
        value = held or Held("", "", (), tool_call, learned)
        with self._lock:
            self.pauses.pause(keys, value, self.clock())
