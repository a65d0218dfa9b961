"""`MemorySegmentStore`: the `SegmentStore` seam (agentcache/kv/store.py) in memory, bounded in
bytes, asking its eviction policy for victims when full."""

from __future__ import annotations

import threading

from agentcache.kv.store import (
    Lookup,
    MissLedger,
    SegmentKey,
    SegmentStore,
    StoredKV,
    StoreStats,
    store_key,
)
from agentcache.policy.eviction import EVICTION_POLICIES, EvictionPolicy


class MemorySegmentStore(SegmentStore):
    """Entries in memory, at most `capacity_bytes` of K/V; when full, `policy` picks victims.
    A lookup returns the entry that was put (the same tensors)."""

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy | str = "lru") -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.policy = EVICTION_POLICIES.get(policy)() if isinstance(policy, str) else policy
        self.stats = StoreStats()
        self._entries: dict[SegmentKey, StoredKV] = {}
        self._ledger = MissLedger()
        self._lock = threading.RLock()

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        key = store_key(model_id, tokenizer_id, cid)
        with self._lock:
            kv = self._entries.get(key)
            if kv is not None and (kv.model_id, kv.tokenizer_id) == (model_id, tokenizer_id):
                self.stats.hits += 1
                self.policy.on_access(key)
                return Lookup(kv, None)
            self.stats.misses += 1
            return Lookup(None, self._ledger.reason(key, cid, model_id, tokenizer_id))

    def peek_content(self, model_id: str, tokenizer_id: str, cid: str) -> StoredKV | None:
        """The held entry, moving no counter and no eviction order."""
        with self._lock:
            return self._entries.get(store_key(model_id, tokenizer_id, cid))

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        return self.peek_content(model_id, tokenizer_id, cid) is not None

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        key = store_key(kv.model_id, kv.tokenizer_id, cid)
        with self._lock:
            if key in self._entries:
                self.policy.on_access(key)
                return True
            if kv.nbytes > self.capacity_bytes:
                self.stats.rejected += 1
                return False
            while self.stats.bytes + kv.nbytes > self.capacity_bytes:
                self._evict_one()
            self._entries[key] = kv
            self._ledger.stored(key, cid, kv.model_id, kv.tokenizer_id)
            self.policy.on_insert(key, kv.nbytes)
            self.stats.entries += 1
            self.stats.bytes += kv.nbytes
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)
            return True

    def _evict_one(self) -> None:
        victim = self.policy.victim()
        if victim is None:
            raise RuntimeError("eviction policy returned no victim for a non-empty store")
        key = SegmentKey(victim)
        kv = self._entries.pop(key)
        self.policy.on_remove(key)
        self.stats.evictions += 1
        self.stats.entries -= 1
        self.stats.bytes -= kv.nbytes
        self._ledger.evicted(key, kv.model_id, kv.tokenizer_id)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self.policy.on_remove(key)
            self._entries.clear()
            self._ledger.clear()
            self.stats.entries = 0
            self.stats.bytes = 0
