"""Content-addressed segment store: KV of token runs keyed by model, tokenizer and token ids.

Entries are immutable once put. The store is bounded in bytes; when full it asks its eviction
policy for victims. A lookup never returns an entry made by another model or tokenizer: the
key includes both ids, and the entry's own ids are checked again on the way out.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from torch import Tensor

from agentcache.policy.eviction import EVICTION_POLICIES, EvictionPolicy

SegmentKey = NewType("SegmentKey", str)


class MissReason(StrEnum):
    NEW = "new"  # this text was never stored
    EVICTED = "evicted"  # stored once, dropped for space
    OTHER_MODEL = "other-model"  # stored, but by another model or tokenizer
    CHECKSUM = "checksum"  # a stored copy failed its checksum


@dataclass(frozen=True)
class StoredKV:
    """KV of T tokens. Keys are stored rotated at `positions`; values carry no position."""

    keys: Tensor  # (L, T, Hkv, Dh)
    values: Tensor  # (L, T, Hkv, Dh)
    positions: Tensor  # (T,) int64
    model_id: str
    tokenizer_id: str
    context_id: str | None = None  # content id of every token before it when it was computed

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class Lookup:
    kv: StoredKV | None
    miss: MissReason | None

    @property
    def hit(self) -> bool:
        return self.kv is not None


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejected: int = 0  # puts larger than the whole capacity
    entries: int = 0
    bytes: int = 0
    peak_bytes: int = 0


def _digest(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x1f")
    return h.hexdigest()


def chain_id(previous: str, token_ids: Sequence[int]) -> str:
    """Content id of a block given its predecessor's: identifies the whole prefix up to it."""
    return _digest("chain", previous, tuple(token_ids))


def content_id(token_ids: Sequence[int], namespace: str, start: int | None) -> str:
    return _digest(namespace, start, tuple(token_ids))


SEGMENT_NAMESPACE = "segment"


def scoped_namespace(namespace: str, scope: str | None) -> str:
    """A segment with a scope is keyed in its own namespace, so other scopes never see it."""
    return namespace if scope is None else f"{namespace}@{scope}"


def segment_content_id(
    token_ids: Sequence[int],
    scope: str | None = None,
    namespace: str = SEGMENT_NAMESPACE,
    start: int | None = None,
) -> str:
    """The content id a segment's KV is stored under, scope included: the one key function
    of every caller that stores, looks up or updates a segment (reuse, vLLM, write-back)."""
    return content_id(token_ids, scoped_namespace(namespace, scope), start)


def segment_key(
    model_id: str,
    tokenizer_id: str,
    token_ids: Sequence[int],
    namespace: str = "segment",
    start: int | None = None,
) -> SegmentKey:
    """Key of a token run. `start` is set only by strategies that need absolute positions."""
    return SegmentKey(_digest(model_id, tokenizer_id, content_id(token_ids, namespace, start)))


class SegmentStore:
    """Bounded, thread-safe map SegmentKey -> StoredKV with hit/miss/evict counters."""

    _EVICTED_MEMORY = 65536  # how many evicted keys are remembered for miss diagnostics

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy | str = "lru") -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.policy = EVICTION_POLICIES.get(policy)() if isinstance(policy, str) else policy
        self.stats = StoreStats()
        self._entries: dict[SegmentKey, StoredKV] = {}
        self._cids: dict[SegmentKey, str] = {}  # stored key -> its content id
        self._owners: dict[str, set[tuple[str, str]]] = {}  # content id -> (model, tokenizer)
        # evicted key -> (content id, model, tokenizer); bounded, so `_owners` is bounded too
        self._evicted: OrderedDict[SegmentKey, tuple[str, str, str]] = OrderedDict()
        self._lock = threading.RLock()

    def lookup(
        self,
        model_id: str,
        tokenizer_id: str,
        token_ids: Sequence[int],
        namespace: str = "segment",
        start: int | None = None,
    ) -> Lookup:
        return self.lookup_content(model_id, tokenizer_id, content_id(token_ids, namespace, start))

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        """Lookup by a precomputed content id (e.g. a chained prefix-block hash)."""
        key = SegmentKey(_digest(model_id, tokenizer_id, cid))
        with self._lock:
            kv = self._entries.get(key)
            if kv is not None and (kv.model_id, kv.tokenizer_id) == (model_id, tokenizer_id):
                self.stats.hits += 1
                self.policy.on_access(key)
                return Lookup(kv, None)
            return self._miss(key, cid, model_id, tokenizer_id)

    def _miss(self, key: SegmentKey, cid: str, model_id: str, tokenizer_id: str) -> Lookup:
        """Count a miss and say why: dropped for space, held by another model, or never seen."""
        self.stats.misses += 1
        if key in self._evicted:
            return Lookup(None, MissReason.EVICTED)
        if self._owners.get(cid, set()) - {(model_id, tokenizer_id)}:
            return Lookup(None, MissReason.OTHER_MODEL)
        return Lookup(None, MissReason.NEW)

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        """Presence check that moves no counter and no eviction order."""
        with self._lock:
            return SegmentKey(_digest(model_id, tokenizer_id, cid)) in self._entries

    def put(
        self,
        token_ids: Sequence[int],
        kv: StoredKV,
        namespace: str = "segment",
        start: int | None = None,
    ) -> bool:
        """Store `kv` under its content key (no-op if present). False if it can never fit."""
        return self.put_content(content_id(token_ids, namespace, start), kv)

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        key = SegmentKey(_digest(kv.model_id, kv.tokenizer_id, cid))
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
            self._cids[key] = cid
            self._owners.setdefault(cid, set()).add((kv.model_id, kv.tokenizer_id))
            self._evicted.pop(key, None)
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
        self._remember_evicted(key, kv.model_id, kv.tokenizer_id)

    def _remember_evicted(self, key: SegmentKey, model_id: str, tokenizer_id: str) -> None:
        """Keep an entry that left the store for miss diagnostics, the newest
        `_EVICTED_MEMORY` of them; an owner is forgotten with its last remembered entry, so
        `_owners` stays bounded by the entries held plus those remembered."""
        self._evicted[key] = (self._cids.pop(key), model_id, tokenizer_id)
        if len(self._evicted) > self._EVICTED_MEMORY:
            _, (cid, old_model, old_tokenizer) = self._evicted.popitem(last=False)
            owners = self._owners.get(cid)
            if owners is not None:
                owners.discard((old_model, old_tokenizer))
                if not owners:
                    del self._owners[cid]

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self.policy.on_remove(key)
            self._entries.clear()
            self._cids.clear()
            self._owners.clear()
            self.stats.entries = 0
            self.stats.bytes = 0
