"""Content-addressed segment store: KV of token runs keyed by model, tokenizer and token ids.

`SegmentStore` is the seam (its docstring holds the contract); `MemorySegmentStore`
(agentcache/kv/memory_store.py) keeps the entries in memory, bounded in bytes. The tiered
store (agentcache/tiers/store.py) and the vLLM folder store (agentcache/engines/vllm/storage.py)
implement the same seam; tests/kv/test_store_contract.py runs one suite over all of them.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

from torch import Tensor

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
    """A store's counters; see `SegmentStore` for what moves them."""

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


def exact_copy_id(
    through_id: str, scope: str | None, start: int, namespace: str = SEGMENT_NAMESPACE
) -> str:
    """The content id of a segment's exact copy for one context: its KV as computed after the
    tokens before it, starting at position `start` (equal, up to rounding, to full
    recompute's there). `through_id` is the chained id of every token up to the segment's
    end (`chain_id(context id, segment ids)`: context and tokens both, no second hash of the
    tokens). Kept beside the segment's first copy (`segment_content_id`), in the segment's
    scope only: a prompt with that very context finds it as an exact run."""
    return _digest(scoped_namespace(f"{namespace}/exact", scope), through_id, start)


def context_copy_id(
    through_id: str, scope: str | None, start: int, namespace: str = SEGMENT_NAMESPACE
) -> str:
    """The content id of a segment's context copy for one context: the KV a turn that reused
    the segment approximately there actually used for it (after its recompute or fusion),
    keyed like its exact copy (`exact_copy_id`) but apart from it, in the segment's scope
    only. A prompt with that very context finds it after an exact copy, before the first copy,
    and uses it as it is: the same context always gets the same KV."""
    return _digest(scoped_namespace(f"{namespace}/context", scope), through_id, start)


INEXACT = "inexact:"


def inexact_context(context_id: str) -> str:
    """The context id a segment's first copy is stored under when its K/V is not full
    recompute's after that context (computed after K/V reused approximately): no prompt's
    chain equals it, so no prompt takes the copy for an exact run; `computed_after` reads the
    context back."""
    return INEXACT + context_id


def computed_after(context_id: str | None) -> str | None:
    """The chained id of the tokens a stored segment was computed after, exactly or not."""
    if context_id is not None and context_id.startswith(INEXACT):
        return context_id[len(INEXACT) :]
    return context_id


def store_key(model_id: str, tokenizer_id: str, cid: str) -> SegmentKey:
    """The key an entry of content id `cid` is held under: model and tokenizer included."""
    return SegmentKey(_digest(model_id, tokenizer_id, cid))


class SegmentStore(ABC):
    """Thread-safe map (model id, tokenizer id, content id) -> StoredKV with counters.

    Contract:
    - Keys. An entry is found by its model id, tokenizer id and content id; the content id of
      a segment, scope included, is `segment_content_id` (one function for every caller), so
      the same tokens under two scopes are two entries. `lookup` / `put` compute a content id
      from token ids (`content_id`); `*_content` take one precomputed.
    - `lookup_content` returns `Lookup(kv, None)` on a hit, else `Lookup(None, reason)`:
      EVICTED when the entry was stored and then dropped for space (remembered for a bounded
      number of entries), OTHER_MODEL when only another model or tokenizer stored that
      content, CHECKSUM when a stored copy failed its check (the copy is forgotten, never
      served), NEW otherwise. An entry made by another model or tokenizer is never returned.
    - `put_content` stores `kv` under its own model and tokenizer ids and returns True, or
      False when it could not (larger than the store, or no room could be made; counted in
      `rejected`). Putting a key already held keeps the held entry (the new KV is not
      taken) and returns True.
    - `contains_content` is a presence check that moves no counter and no eviction order.
    - Counters (`stats`): each lookup counts exactly one hit or one miss; `evictions` counts
      entries dropped for space; `entries` / `bytes` are what is held now (`peak_bytes` the
      most ever held). Counters move only through the store's own calls.
    - Stored KV is immutable: a store never changes an entry's tensors in place (an entry,
      or a page of it in the tiered store's `update_pages`, is replaced or dropped, never
      edited), so what a lookup returned keeps its values after later puts, updates,
      evictions and `clear()`. A caller must not change the tensors it put, nor
      those a lookup returned: a store may keep the first and hand the second to later
      lookups.
    - `clear()` removes every entry the store holds and its history: afterwards a lookup of
      anything stored before misses with NEW, as in a fresh store. It is not an eviction
      (`evictions` does not move); `entries` and `bytes` drop to 0, the other counters keep
      counting.
    - Every method may be called from several threads at once.
    """

    stats: StoreStats
    capacity_bytes: int

    def lookup(
        self,
        model_id: str,
        tokenizer_id: str,
        token_ids: Sequence[int],
        namespace: str = "segment",
        start: int | None = None,
    ) -> Lookup:
        return self.lookup_content(model_id, tokenizer_id, content_id(token_ids, namespace, start))

    def put(
        self,
        token_ids: Sequence[int],
        kv: StoredKV,
        namespace: str = "segment",
        start: int | None = None,
    ) -> bool:
        """Store `kv` under the content id of `token_ids`; `start` is set only by strategies
        that need absolute positions."""
        return self.put_content(content_id(token_ids, namespace, start), kv)

    @abstractmethod
    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup: ...

    @abstractmethod
    def put_content(self, cid: str, kv: StoredKV) -> bool: ...

    @abstractmethod
    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool: ...

    @abstractmethod
    def clear(self) -> None: ...


class MissLedger:
    """Why a key misses: the entries held and those that left for space (the newest `memory`
    of them), by content id and owner. Not thread-safe: its store's lock guards it."""

    def __init__(self, memory: int = 8192) -> None:
        self.memory = memory  # how many evicted keys are remembered for miss diagnostics
        self._cids: dict[SegmentKey, str] = {}  # stored key -> its content id
        self._owners: dict[str, set[tuple[str, str]]] = {}  # content id -> (model, tokenizer)
        # evicted key -> (content id, model, tokenizer); bounded, so `_owners` is bounded too
        self._evicted: OrderedDict[SegmentKey, tuple[str, str, str]] = OrderedDict()

    def stored(self, key: SegmentKey, cid: str, model_id: str, tokenizer_id: str) -> None:
        self._cids[key] = cid
        self._owners.setdefault(cid, set()).add((model_id, tokenizer_id))
        self._evicted.pop(key, None)

    def evicted(self, key: SegmentKey, model_id: str, tokenizer_id: str) -> None:
        """Remember an entry that left for space; an owner is forgotten with its last
        remembered entry, so `_owners` stays bounded by the entries held plus those
        remembered."""
        self._evicted[key] = (self._cids.pop(key), model_id, tokenizer_id)
        if len(self._evicted) > self.memory:
            _, (cid, old_model, old_tokenizer) = self._evicted.popitem(last=False)
            owners = self._owners.get(cid)
            if owners is not None:
                owners.discard((old_model, old_tokenizer))
                if not owners:
                    del self._owners[cid]

    def reason(self, key: SegmentKey, cid: str, model_id: str, tokenizer_id: str) -> MissReason:
        """Dropped for space, held by another model, or never seen."""
        if key in self._evicted:
            return MissReason.EVICTED
        if self._owners.get(cid, set()) - {(model_id, tokenizer_id)}:
            return MissReason.OTHER_MODEL
        return MissReason.NEW

    def clear(self) -> None:
        self._cids.clear()
        self._owners.clear()
        self._evicted.clear()
