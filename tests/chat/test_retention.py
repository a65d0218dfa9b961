"""Retention across tool pauses on a tiny model, counted in tokens the next request loads: a
paused conversation's segments survive the pressure that evicts an unpaused one's, an expired
retention protects nothing, the retained share holds, the learned default follows the
observed gaps, one tenant's retention never protects or reports another's entries, and with
tiers what is not retained spills to the host tier instead of being dropped."""

from __future__ import annotations

import pytest

from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.retention import TurnRetention
from agentcache.chat.runner import ChatEngine, ChatRequest, ChatResult
from agentcache.chat.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.retention import GapLearner, RetentionConfig
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.tiers import TierConfig, TieredSegmentStore

PARAMS = GenerationParams(max_new_tokens=1)
TOOL = ToolSpec("ls", "list files", {"type": "object", "properties": {}})
CALL = TOOL_CALL_OPEN + '\n{"name": "ls", "arguments": {}}\n' + TOOL_CALL_CLOSE


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def opening(name: str) -> list[ChatMessage]:
    return [ChatMessage("system", f"You are agent {name}. " * 6),
            ChatMessage("user", f"task for {name}: list the files")]  # fmt: skip


def turn(ce: ChatEngine, messages: list[ChatMessage], tool_call: bool = False,
         tenant: str = "", retention_s: float | None = None) -> ChatResult:  # fmt: skip
    """One turn; `tool_call`: the reply is a call of `ls` (prefilled, so the random model's
    turn ends in a tool call)."""
    req = ChatRequest(tuple(messages), PARAMS, (TOOL,), prefill=CALL if tool_call else None,
                      tenant=tenant, retention_s=retention_s)  # fmt: skip
    return ce.run(ce.prepare(req))


def resume(messages: list[ChatMessage], result: ChatResult) -> list[ChatMessage]:
    """The conversation's next request: the tool call it ended in, and the tool's result."""
    call = result.message()
    assert call.tool_calls
    return [*messages, call, ChatMessage("tool", "a.txt b.txt", tool_call_id=call.tool_calls[0].id)]


def own(first: ChatResult) -> set[str]:
    """The segment ids of a conversation's own messages (the tools block is shared by every
    conversation of the tenant: it stays hot whatever is retained)."""
    return {s.segment_id for s in first.report.segments if s.segment_id.startswith("msg-")}


def loaded(result: ChatResult, ids: set[str]) -> int:
    """Tokens of these segments the request loaded from their own store entries (none
    computed). A missed segment's head (the opening it shares with another segment stored
    after the same context, reuse/segments.py) comes from another entry: not counted."""
    found = [s for s in result.report.segments if s.segment_id in ids]
    assert len(found) == len(ids)
    return sum((s.exact_tokens or 0) + (s.moved_tokens or 0) + (s.refreshed_tokens or 0)
               for s in found if s.status in ("hit", "moved"))  # fmt: skip


def tokens(result: ChatResult, ids: set[str]) -> int:
    return sum(s.num_tokens for s in result.report.segments if s.segment_id in ids)


def conversation_bytes(tiny: LoadedModel) -> int:
    """What one opening turn stores (every opening here is the same size)."""
    eng = Engine(tiny, EngineConfig(kv_pages=256))
    turn(ChatEngine(eng), opening("A"), tool_call=True)
    return eng.store.stats.bytes


def store_of(ce: ChatEngine) -> MemorySegmentStore:
    store = getattr(ce.engine, "store", None)
    assert isinstance(store, MemorySegmentStore)
    return store


def engine(
    tiny: LoadedModel, clock: Clock, capacity: int, retain: bool = True, share: float = 0.5,
    min_gaps: int = 8, tenant_share: float = 1.0, tenant_reserve: float | None = None,
) -> ChatEngine:  # fmt: skip
    """`tenant_share` 1 by default: these tests are of one tenant and the whole share."""
    store = MemorySegmentStore(capacity, clock=clock)
    eng = Engine(tiny, EngineConfig(kv_pages=256), store=store)
    config = RetentionConfig(default_s=30, max_s=600, pinned_share=share,
                             tenant_share=tenant_share, tenant_reserve=tenant_reserve)  # fmt: skip
    kept = TurnRetention(eng, config, clock, GapLearner(config, min_gaps=min_gaps))
    return ChatEngine(eng, retention=kept if retain else None)


def pressure(ce: ChatEngine, names: str = "CDEF") -> None:
    for name in names:
        turn(ce, opening(name))


@pytest.mark.parametrize("retain", [True, False])
def test_a_paused_conversation_survives_pressure_that_evicts_others(
    tiny: LoadedModel, retain: bool
) -> None:
    clock = Clock()
    ce = engine(tiny, clock, int(2.5 * conversation_bytes(tiny)), retain)
    a, b = opening("A"), opening("B")
    ra = turn(ce, a, tool_call=True)
    rb = turn(ce, b)
    clock.now = 10.0  # within the learned default (30 s)
    pressure(ce)  # four more conversations through a store that holds two and a half
    next_a = turn(ce, resume(a, ra))
    next_b = turn(ce, [*b, ChatMessage("user", "and then?")])
    if retain:
        assert ra.retention is not None and ra.retention.source == "learned"
        assert ra.retention.granted_s == 30 and ra.retention.pinned_segments > 0
        # system and user message loaded whole, none of their tokens computed
        assert loaded(next_a, own(ra)) == tokens(next_a, own(ra)) > 0
        assert next_a.retention is not None and next_a.retention.resumed_after_s == 10.0
    else:  # the reference: without retention LRU drops A as it drops B
        assert ra.retention is None and loaded(next_a, own(ra)) == 0
    assert loaded(next_b, own(rb)) == 0
    assert {s.reason for s in next_b.report.segments if s.segment_id in own(rb)} == {"evicted"}


def test_an_expired_retention_is_evictable_at_once(tiny: LoadedModel) -> None:
    clock = Clock()
    ce = engine(tiny, clock, int(2.5 * conversation_bytes(tiny)))
    a = opening("A")
    ra = turn(ce, a, tool_call=True)
    assert ra.retention is not None and ra.retention.granted_s == 30
    clock.now = 30.0  # expired: no sleeping, the store's clock says so
    assert store_of(ce).retention_stats().pinned_bytes == 0
    pressure(ce, "CDE")
    next_a = turn(ce, resume(a, ra))
    assert loaded(next_a, own(ra)) == 0
    assert {s.reason for s in next_a.report.segments if s.segment_id in own(ra)} == {"evicted"}


def test_a_requested_retention_is_kept_for_its_time_capped(tiny: LoadedModel) -> None:
    clock = Clock()
    ce = engine(tiny, clock, int(2.5 * conversation_bytes(tiny)))
    a = opening("A")
    ra = turn(ce, a, retention_s=5000)  # no tool call: kept because it asked, capped at 600
    assert ra.retention is not None
    assert (ra.retention.source, ra.retention.requested_s, ra.retention.granted_s) == (
        "request", 5000, 600)  # fmt: skip
    clock.now = 599.0
    pressure(ce)
    again = turn(ce, [*a, ra.message(), ChatMessage("user", "more")])
    assert loaded(again, own(ra)) == tokens(again, own(ra)) > 0
    plain = turn(ce, opening("G"))
    assert plain.retention is not None and plain.retention.granted_s is None
    assert plain.retention.pinned_segments == 0


@pytest.mark.parametrize("tenant_share", [0.5, 1.0])
def test_one_tenant_cannot_fill_the_share_another_still_gets_pins(
    tiny: LoadedModel, tenant_share: float
) -> None:
    """Tenant A pauses three conversations in a share that holds two, a tenant's part one:
    A's pins stop at its part (counted as refused for it) and B's pause is pinned whole.
    The reference, without a tenant's part, lets A fill the share and B is refused."""
    clock = Clock()
    one = conversation_bytes(tiny)
    ce = engine(tiny, clock, 4 * one + 1, share=0.5, tenant_share=tenant_share)
    store = store_of(ce)
    a = [turn(ce, opening(name), tool_call=True, tenant="A") for name in "ACD"]
    b = turn(ce, opening("B"), tool_call=True, tenant="B")
    assert all(r.retention is not None for r in (*a, b))
    a_refused = sum(r.retention.tenant_refused_segments for r in a if r.retention is not None)
    assert b.retention is not None
    stats = store.retention_stats()
    if tenant_share < 1:
        assert store.retained.owner_bytes("A", clock()) <= one  # half the share
        assert a_refused > 0 and stats.owner_refused == a_refused
        assert b.retention.refused_segments == 0 and b.retention.pinned_bytes > 0
    else:
        assert a_refused == 0 and stats.owner_refused == 0
        assert b.retention.refused_segments > 0


@pytest.mark.parametrize("reserve", [0.25, 0.0])
def test_a_third_tenant_gets_its_reservation_when_two_have_filled_the_share(
    tiny: LoadedModel, reserve: float
) -> None:
    """A and B pause two conversations each, filling a share that holds two (each tenant's part
    one); C's pause then gets its reservation (a quarter of the share) by ending A's and B's
    pins beyond theirs, and A and B keep theirs. The reference, without reservations: C gets
    nothing until their pins expire."""
    clock = Clock()
    one = conversation_bytes(tiny)
    ce = engine(tiny, clock, 4 * one + 1, share=0.5, tenant_share=0.5, tenant_reserve=reserve)
    store = store_of(ce)
    for tenant, names in (("A", "AD"), ("B", "BE")):
        for name in names:
            turn(ce, opening(name), tool_call=True, tenant=tenant)
    full = store.retention_stats()
    assert full.pinned_bytes > 0.8 * full.max_bytes and full.preempted == 0
    c = turn(ce, opening("C"), tool_call=True, tenant="C")
    assert c.retention is not None
    stats, table = store.retention_stats(), store.retained
    if reserve > 0:
        assert c.retention.pinned_segments > 0 and stats.preempted > 0
        assert table.owner_bytes("C", clock()) <= table.owner_reserve_bytes
        for tenant in "AB":
            assert table.owner_bytes(tenant, clock()) >= table.owner_reserve_bytes
        assert stats.pinned_bytes <= stats.max_bytes
    else:
        assert c.retention.pinned_segments == 0 and stats.preempted == 0


def test_retained_bytes_stay_within_the_share(tiny: LoadedModel) -> None:
    clock = Clock()
    one = conversation_bytes(tiny)
    capacity = 4 * one
    ce = engine(tiny, clock, capacity, share=0.3)  # 1.2 conversations may be retained
    store = store_of(ce)
    results = [turn(ce, opening(name), tool_call=True) for name in "ABCDEF"]
    for r in results:
        assert r.retention is not None
    assert store.retention_stats().pinned_bytes <= 0.3 * capacity
    assert store.retention_stats().max_bytes == int(0.3 * capacity)
    refused = sum(r.retention.refused_segments for r in results if r.retention is not None)
    assert refused > 0 and store.retention_stats().refused == refused
    # the first was pinned whole; the later ones found the share taken
    assert results[0].retention is not None and results[0].retention.refused_segments == 0
    assert results[-1].retention is not None and results[-1].retention.refused_segments > 0


def test_the_learned_default_follows_the_observed_gaps(tiny: LoadedModel) -> None:
    clock = Clock()
    ce = engine(tiny, clock, 64 * conversation_bytes(tiny), min_gaps=3)
    kept = ce.retention
    assert kept is not None
    granted = []
    for name, gap in (("A", 4.0), ("B", 12.0), ("C", 20.0)):
        msgs = opening(name)
        r = turn(ce, msgs, tool_call=True)
        assert r.retention is not None
        granted.append(r.retention.granted_s)
        clock.now += gap
        nxt = turn(ce, resume(msgs, r))
        assert nxt.retention is not None and nxt.retention.resumed_after_s == gap
    assert granted == [30, 30, 30]  # the default until three gaps are seen
    assert kept.default_s("") == 20.0  # the 0.9 quantile of 4, 12, 20
    assert kept.default_s("another tenant") == 30  # learned from its own pauses only
    r = turn(ce, opening("D"), tool_call=True)
    assert r.retention is not None and r.retention.granted_s == 20.0
    for _ in range(10):  # pauses grow: the learned time follows, up to the cap
        msgs = opening("E")
        r = turn(ce, msgs, tool_call=True)
        clock.now += 900.0
        turn(ce, resume(msgs, r))
    assert kept.default_s("") == 600


def test_a_tenants_retention_never_protects_or_reports_anothers(tiny: LoadedModel) -> None:
    clock = Clock()
    ce = engine(tiny, clock, int(2.5 * conversation_bytes(tiny)))
    store = store_of(ce)
    a = opening("A")  # the same messages for both tenants
    ra = turn(ce, a, tool_call=True, tenant="tenant-a")
    pinned = store.retention_stats().pinned_entries
    rb = turn(ce, a, tenant="tenant-b")  # not paused: nothing pinned for it
    assert rb.retention is not None and rb.retention.pinned_segments == 0
    assert store.retention_stats().pinned_entries == pinned
    # tenant b resending tenant a's tool call does not resume a's pause
    rb2 = turn(ce, resume(a, ra), tenant="tenant-b")
    assert rb2.retention is not None and rb2.retention.resumed_after_s is None
    clock.now = 5.0
    pressure(ce)
    next_a = turn(ce, resume(a, ra), tenant="tenant-a")
    next_b = turn(ce, resume(a, ra), tenant="tenant-b")
    assert loaded(next_a, own(ra)) == tokens(next_a, own(ra)) > 0
    assert next_a.retention is not None and next_a.retention.resumed_after_s == 5.0
    assert loaded(next_b, own(ra)) == 0  # identical text, another scope: not protected
    assert next_b.retention is not None and next_b.retention.pinned_segments == 0


def test_with_tiers_the_rest_spills_to_host_and_the_resumed_turn_is_prefetched(
    tiny: LoadedModel,
) -> None:
    clock = Clock()
    one = conversation_bytes(tiny)
    tiers = TierConfig(fast_bytes=int(1.5 * one), host_bytes=20 * one)
    store = TieredSegmentStore(tiers, clock=clock)
    eng = Engine(tiny, EngineConfig(kv_pages=256), store=store)
    config = RetentionConfig(default_s=30, max_s=600, pinned_share=0.3)  # less than A's bytes
    ce = ChatEngine(eng, retention=TurnRetention(eng, config, clock))
    a, b = opening("A"), opening("B")
    ra = turn(ce, a, tool_call=True)
    rb = turn(ce, b)
    assert ra.retention is not None and ra.retention.pinned_segments > 0
    assert ra.retention.refused_segments > 0  # beyond the share: left to the spill policy
    clock.now = 10.0
    pressure(ce)
    assert store.stats.evictions == 0 and store.tier_stats.written_pages > 0  # spilled, kept
    next_a = turn(ce, resume(a, ra))
    assert next_a.retention is not None and next_a.retention.prefetched_pages > 0
    assert loaded(next_a, own(ra)) == tokens(next_a, own(ra)) > 0
    host_loads = store.tier("host").counters.loads
    next_b = turn(ce, [*b, ChatMessage("user", "and then?")])  # not retained: from host
    assert loaded(next_b, own(rb)) == tokens(next_b, own(rb)) > 0
    assert store.tier("host").counters.loads > host_loads
    store.close()


@pytest.mark.parametrize("asked", [None, 300.0])
def test_the_next_request_releases_a_learned_retention_not_an_asked_one(
    tiny: LoadedModel, asked: float | None
) -> None:
    clock = Clock()
    ce = engine(tiny, clock, 64 * conversation_bytes(tiny))
    a = opening("A")
    ra = turn(ce, a, tool_call=True, retention_s=asked)
    assert ra.retention is not None and ra.retention.pinned_segments > 0
    clock.now = 5.0
    nxt = turn(ce, resume(a, ra))  # not a tool call, asks for nothing: keeps nothing itself
    assert nxt.retention is not None and nxt.retention.resumed_after_s == 5.0
    pinned = store_of(ce).retention_stats().pinned_entries
    assert pinned == (0 if asked is None else ra.retention.pinned_segments)
