"""`MemorySegmentStore`: the `SegmentStore` seam (agentcache/kv/store.py) in memory, bounded in
bytes, asking its eviction policy for victims when full; retained entries (`RetainingStore`,
agentcache/kv/retention.py) are skipped until they expire."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace

from agentcache.kv.retention import (
    PinResult,
    PinTable,
    RetainingStore,
    RetentionStats,
    check_shares,
)
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


class MemorySegmentStore(SegmentStore, RetainingStore):
    """Entries in memory, at most `capacity_bytes` of K/V; when full, `policy` picks victims,
    retained ones skipped. A lookup returns the entry that was put (the same tensors).
    `retain_share`: of `capacity_bytes`, the most retained entries hold; `clock`: seconds,
    what retentions expire on."""

    def __init__(
        self, capacity_bytes: int, policy: EvictionPolicy | str = "lru",
        retain_share: float = 0.25, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.policy = EVICTION_POLICIES.get(policy)() if isinstance(policy, str) else policy
        self.stats = StoreStats()
        self._entries: dict[SegmentKey, StoredKV] = {}
        self._ledger = MissLedger()
        self._lock = threading.RLock()
        self.retained = PinTable(0)
        self.clock = clock
        self.set_retain_share(retain_share)

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
            if kv.nbytes > self.capacity_bytes or not self._make_room(kv.nbytes):
                self.stats.rejected += 1
                return False
            self._entries[key] = kv
            self._ledger.stored(key, cid, kv.model_id, kv.tokenizer_id)
            self.policy.on_insert(key, kv.nbytes)
            self.stats.entries += 1
            self.stats.bytes += kv.nbytes
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)
            return True

    def _make_room(self, need: int) -> bool:
        """Evict unretained entries in policy order until `need` bytes fit; False, evicting
        nothing, when the retained entries leave too little room."""
        now = self.clock()
        if self.retained.pinned_bytes(now) + need > self.capacity_bytes:
            return False
        skipped = []
        while self.stats.bytes + need > self.capacity_bytes:
            victim = self.policy.victim()
            if victim is None:
                raise RuntimeError("eviction policy returned no victim for a non-empty store")
            key = SegmentKey(victim)
            if self.retained.is_pinned(key, now):  # retained: skipped this round
                self.policy.on_remove(key)
                skipped.append(key)
                continue
            self._evict(key)
        for key in skipped:
            self.policy.on_insert(key, self._entries[key].nbytes)
        return True

    def _evict(self, key: SegmentKey) -> None:
        kv = self._entries.pop(key)
        self.policy.on_remove(key)
        self.retained.unpin([key])
        self.stats.evictions += 1
        self.stats.entries -= 1
        self.stats.bytes -= kv.nbytes
        self._ledger.evicted(key, kv.model_id, kv.tokenizer_id)

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self.policy.on_remove(key)
            self.retained.unpin(list(self._entries))
            self._entries.clear()
            self._ledger.clear()
            self.stats.entries = 0
            self.stats.bytes = 0

    # ---- retention (RetainingStore) ----

    def retain(
        self, model_id: str, tokenizer_id: str, cids: Sequence[str], seconds: float,
        owner: Hashable = None,
    ) -> PinResult:  # fmt: skip
        with self._lock:
            sizes, absent = [], []
            for cid in cids:
                key = store_key(model_id, tokenizer_id, cid)
                kv = self._entries.get(key)
                if kv is None:
                    absent.append(key)
                else:
                    sizes.append((key, kv.nbytes))
            got = self.retained.pin(sizes, seconds, self.clock(), owner)
            return replace(got, refused=(*got.refused, *absent))

    def release(self, model_id: str, tokenizer_id: str, cids: Sequence[str]) -> None:
        with self._lock:
            self.retained.unpin([store_key(model_id, tokenizer_id, c) for c in cids])

    def set_retain_share(
        self, share: float, owner_share: float = 1.0, owner_reserve: float = 0.0
    ) -> None:
        check_shares(share, owner_share, owner_reserve)
        with self._lock:
            self.retained.bound(int(share * self.capacity_bytes), owner_share, owner_reserve)

    def retention_stats(self) -> RetentionStats:
        with self._lock:
            return self.retained.stats(self.clock())
