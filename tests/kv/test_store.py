from __future__ import annotations

import pytest
import torch

from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.store import (
    MissReason,
    StoredKV,
    chain_id,
    content_id,
    store_key,
)
from agentcache.policy.eviction import EVICTION_POLICIES, EvictionPolicy

A, B = "model-a", "model-b"
TOK, TOK2 = "tok-1", "tok-2"
ENTRY = 32  # bytes of one entry built by kv(n=1): K and V, 4 fp32 each


def kv(n: int = 1, model: str = A, tok: str = TOK, fill: float = 1.0) -> StoredKV:
    """n tokens, one layer, one head of dim 4: ENTRY * n bytes."""
    keys = torch.full((1, n, 1, 4), fill)
    return StoredKV(keys, keys.clone(), torch.arange(n), model, tok)


def test_stored_kv_sizes() -> None:
    e = kv(3)
    assert e.num_tokens == 3
    assert e.nbytes == 2 * 3 * 4 * 4


def test_put_then_lookup_hits_same_entry() -> None:
    store = MemorySegmentStore(1 << 20)
    entry = kv()
    assert store.put([1, 2, 3], entry) is True
    got = store.lookup(A, TOK, [1, 2, 3])
    assert got.hit and got.miss is None
    assert got.kv is entry
    assert store.stats.hits == 1 and store.stats.misses == 0
    assert store.stats.entries == 1


def test_miss_new_for_never_stored_tokens() -> None:
    store = MemorySegmentStore(1 << 20)
    store.put([1, 2, 3], kv())
    got = store.lookup(A, TOK, [1, 2, 4])
    assert not got.hit and got.kv is None
    assert got.miss is MissReason.NEW
    assert store.stats.misses == 1 and store.stats.hits == 0


def test_namespace_and_start_are_part_of_the_key() -> None:
    store = MemorySegmentStore(1 << 20)
    store.put([1, 2], kv(), namespace="fixed", start=10)
    assert store.lookup(A, TOK, [1, 2], namespace="fixed", start=10).hit
    assert store.lookup(A, TOK, [1, 2], namespace="fixed", start=11).miss is MissReason.NEW
    assert store.lookup(A, TOK, [1, 2], namespace="fixed").miss is MissReason.NEW
    assert store.lookup(A, TOK, [1, 2], start=10).miss is MissReason.NEW


@pytest.mark.parametrize(
    ("model", "tok"), [(B, TOK), (A, TOK2), (B, TOK2)], ids=["model", "tokenizer", "both"]
)
def test_entry_of_another_model_or_tokenizer_is_never_returned(model: str, tok: str) -> None:
    """Acceptance: a cached segment from another model or tokenizer is never used."""
    store = MemorySegmentStore(1 << 20)
    ids = [5, 6, 7, 8]
    store.put(ids, kv(model=A, tok=TOK))
    got = store.lookup(model, tok, ids)
    assert got.kv is None
    assert got.miss is MissReason.OTHER_MODEL
    # the same holds for content-id lookups and presence checks
    cid = content_id(ids, "segment", None)
    assert store.lookup_content(model, tok, cid).kv is None
    assert not store.contains_content(model, tok, cid)
    # once the other model stores its own copy, each gets exactly its own entry
    own = kv(model=model, tok=tok, fill=2.0)
    store.put(ids, own)
    assert store.lookup(model, tok, ids).kv is own
    first = store.lookup(A, TOK, ids).kv
    assert first is not None and first.model_id == A and first.tokenizer_id == TOK
    assert store.stats.entries == 2


def test_keys_differ_by_model_and_tokenizer() -> None:
    keys = {
        store_key(m, t, content_id([1, 2, 3], "segment", None)) for m in (A, B) for t in (TOK, TOK2)
    }
    assert len(keys) == 4


def test_evicted_miss_after_capacity_pressure() -> None:
    store = MemorySegmentStore(2 * ENTRY)
    store.put([1], kv())
    store.put([2], kv())
    store.put([3], kv())  # evicts [1]
    assert store.stats.evictions == 1
    assert store.lookup(A, TOK, [1]).miss is MissReason.EVICTED
    assert store.lookup(A, TOK, [2]).hit
    assert store.lookup(A, TOK, [3]).hit
    # another model's lookup of the evicted text is still not served
    assert store.lookup(B, TOK, [1]).kv is None


def test_own_evicted_entry_is_not_reported_as_another_models() -> None:
    store = MemorySegmentStore(ENTRY)
    store._ledger.memory = 1  # remember only the latest eviction
    store.put([1], kv())
    store.put([2], kv())  # evicts [1]
    store.put([3], kv())  # evicts [2]; [1] falls out of the eviction memory
    got = store.lookup(A, TOK, [1])
    assert got.kv is None
    assert got.miss is MissReason.NEW  # no other model ever stored [1]


def test_lru_eviction_order_and_access_refreshes() -> None:
    store = MemorySegmentStore(3 * ENTRY, "lru")
    for t in (1, 2, 3):
        store.put([t], kv())
    assert store.lookup(A, TOK, [1]).hit  # 1 becomes most recent: order 2, 3, 1
    store.put([4], kv())
    assert store.lookup(A, TOK, [2]).miss is MissReason.EVICTED
    assert store.contains_content(A, TOK, content_id([1], "segment", None))
    store.put([5], kv())  # order was 3, 1, 4 -> 3 goes
    assert store.lookup(A, TOK, [3]).miss is MissReason.EVICTED
    assert [store.lookup(A, TOK, [t]).hit for t in (1, 4, 5)] == [True, True, True]
    assert store.stats.evictions == 2


def test_fifo_ignores_access() -> None:
    store = MemorySegmentStore(3 * ENTRY, "fifo")
    for t in (1, 2, 3):
        store.put([t], kv())
    assert store.lookup(A, TOK, [1]).hit
    store.put([4], kv())
    assert store.lookup(A, TOK, [1]).miss is MissReason.EVICTED
    assert store.lookup(A, TOK, [2]).hit


def test_reput_refreshes_lru_and_does_not_double_count() -> None:
    store = MemorySegmentStore(2 * ENTRY)
    store.put([1], kv())
    store.put([2], kv())
    assert store.put([1], kv(fill=9.0)) is True  # already present: refresh only
    assert store.stats.entries == 2 and store.stats.bytes == 2 * ENTRY
    store.put([3], kv())  # 2 is now the oldest
    assert store.lookup(A, TOK, [2]).miss is MissReason.EVICTED
    kept = store.lookup(A, TOK, [1]).kv
    assert kept is not None and kept.keys[0, 0, 0, 0].item() == 1.0  # entries are immutable


def test_contains_content_moves_no_counter_and_no_order() -> None:
    store = MemorySegmentStore(2 * ENTRY)
    store.put([1], kv())
    store.put([2], kv())
    before = (store.stats.hits, store.stats.misses)
    cid1 = content_id([1], "segment", None)
    assert store.contains_content(A, TOK, cid1)
    assert not store.contains_content(A, TOK, content_id([9], "segment", None))
    assert (store.stats.hits, store.stats.misses) == before
    store.put([3], kv())  # 1 was not refreshed by contains_content, so it goes
    assert not store.contains_content(A, TOK, cid1)


def test_byte_accounting_and_peak() -> None:
    store = MemorySegmentStore(4 * ENTRY)
    store.put([1], kv(2))
    store.put([2], kv(2))
    assert store.stats.bytes == 4 * ENTRY and store.stats.peak_bytes == 4 * ENTRY
    store.put([3], kv(3))  # 3 more entries' worth: both older entries must go
    assert store.stats.evictions == 2
    assert store.stats.bytes == 3 * ENTRY
    assert store.stats.entries == 1
    assert store.stats.peak_bytes == 4 * ENTRY
    store.put([4], kv(1))
    assert store.stats.bytes == 4 * ENTRY == store.stats.peak_bytes
    assert store.stats.entries == 2
    store.clear()
    assert store.stats.bytes == 0 and store.stats.entries == 0
    assert store.stats.peak_bytes == 4 * ENTRY
    assert store.lookup(A, TOK, [4]).kv is None


def test_put_larger_than_capacity_is_rejected_and_counted() -> None:
    store = MemorySegmentStore(2 * ENTRY)
    store.put([1], kv())
    assert store.put([2], kv(3)) is False
    assert store.stats.rejected == 1
    assert store.stats.evictions == 0  # nothing was dropped to make room for it
    assert store.lookup(A, TOK, [1]).hit
    assert store.lookup(A, TOK, [2]).miss is MissReason.NEW
    assert store.stats.bytes == ENTRY


def test_negative_capacity_rejected() -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        MemorySegmentStore(-1)


def test_chain_id_depends_on_predecessor_and_tokens() -> None:
    root = chain_id("root", [1, 2])
    assert root == chain_id("root", (1, 2))  # deterministic, sequence type does not matter
    assert chain_id(root, [3]) != chain_id("root", [3])
    assert chain_id("root", [1, 2]) != chain_id("root", [2, 1])
    assert chain_id("root", [1, 2]) != content_id([1, 2], "root", None)


def test_lookup_content_by_chain_id() -> None:
    store = MemorySegmentStore(1 << 20)
    c0 = chain_id("root", [1, 2])
    c1 = chain_id(c0, [3, 4])
    entry = kv(2)
    assert store.put_content(c1, entry)
    assert store.lookup_content(A, TOK, c1).kv is entry
    assert store.lookup_content(A, TOK, c0).miss is MissReason.NEW
    # the same tokens after a different predecessor are a different block
    assert store.lookup_content(A, TOK, chain_id("other", [3, 4])).miss is MissReason.NEW
    assert store.lookup_content(B, TOK, c1).miss is MissReason.OTHER_MODEL
    assert store.stats.hits == 1 and store.stats.misses == 3


def test_unknown_eviction_policy_name_lists_known() -> None:
    from agentcache.errors import UnknownStrategyError

    with pytest.raises(UnknownStrategyError, match="lru"):
        MemorySegmentStore(1, "nope")


@pytest.mark.parametrize("name", EVICTION_POLICIES.names())
def test_eviction_policy_contract(name: str) -> None:
    policy: EvictionPolicy = EVICTION_POLICIES.get(name)()
    assert policy.victim() is None
    keys = [f"k{i}" for i in range(5)]
    for i, k in enumerate(keys):
        policy.on_insert(k, 10 * (i + 1))
    policy.on_access("k2")
    policy.on_access("not-tracked")  # accessing an unknown key must not start tracking it
    tracked = set(keys)
    while tracked:
        v = policy.victim()
        assert v in tracked
        assert policy.victim() == v  # victim() does not remove
        policy.on_remove(v)
        tracked.discard(v)
        assert policy.victim() != v
    assert policy.victim() is None
    policy.on_remove("k0")  # removing an untracked key is a no-op
    assert policy.victim() is None


@pytest.mark.parametrize("name", EVICTION_POLICIES.names())
def test_store_respects_capacity_under_every_policy(name: str) -> None:
    store = MemorySegmentStore(3 * ENTRY, name)
    for t in range(20):
        assert store.put([t], kv())
        assert store.stats.bytes <= 3 * ENTRY
        assert store.lookup(A, TOK, [t]).hit  # the newest entry is never the one evicted
    assert store.stats.entries == 3
    assert store.stats.evictions == 17


def test_other_model_miss_is_forgotten_with_the_eviction_memory() -> None:
    store = MemorySegmentStore(ENTRY)
    store._ledger.memory = 1
    store.put([1], kv(model=A))
    store.put([2], kv(model=A))  # evicts A's [1]
    assert store.lookup(B, TOK, [1]).miss is MissReason.OTHER_MODEL
    store.put([3], kv(model=A))  # A's [1] leaves the eviction memory; its owner record goes too
    assert store.lookup(B, TOK, [1]).miss is MissReason.NEW
    assert store._ledger._owners.keys() == {content_id(t, "segment", None) for t in ([2], [3])}
