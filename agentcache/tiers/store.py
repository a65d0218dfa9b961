"""Tiered segment store: segment KV as pages in fast / host / disk tiers.

An implementation of the `SegmentStore` seam (agentcache/kv/store.py holds its contract), so
every strategy uses it unchanged. What it adds:

    put      : the segment's pages go to the fast tier (room made by spilling)
    lookup   : pages are read from the fastest tier holding their current version and
               promoted back to fast; a page failing its checksum makes the lookup a
               CHECKSUM miss and forgets the segment (recomputed, never served)
    update   : a newer version of some pages (tokens recomputed or fused during reuse) lands
               in fast; lower copies become stale by that many tokens (the page is dirty)
    spill    : a full tier asks the spill policy for victims: clean pages are dropped, the
               rest written to the tier below, one write call per extent
    evict    : the lowest tier, when full, drops whole segments in eviction-policy order

Per page, `stale[tier]` is a bit mask of the token slots whose K/V the copy in that tier
lacks (absent: no copy; bit i: the page's token i). The fastest copy is always current
(stale 0). A page is clean in tier i when its copy there is outdated (a newer one lives
above) or some tier below holds a current copy; its dirty count is the fewest stale slots of
any copy below.

An update changes only the slots it names: the new version is the current one with those
slots replaced (keys, values and the positions their keys are rotated at), so a lower copy
differs from the current version exactly at its stale slots. A spill policy with `deltas`
writes such a page to the disk tier as a delta of those slots instead of whole.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentcache.errors import ConfigError
from agentcache.kv.store import (
    Lookup,
    MissLedger,
    MissReason,
    SegmentKey,
    SegmentStore,
    StoredKV,
    StoreStats,
    store_key,
)
from agentcache.policy.eviction import EVICTION_POLICIES, EvictionPolicy
from agentcache.policy.spill import SPILL_POLICIES, PageInfo, SpillPlan, SpillPolicy
from agentcache.tiers.base import PageData, PageKey, Tier, TierCapacityError, TierError
from agentcache.tiers.disk import DiskTier
from agentcache.tiers.memory import MemoryTier
from agentcache.units import GiB


@dataclass(frozen=True)
class TierConfig:
    """Capacities of the tiers (bytes of K/V), the spill policy, and the disk folder.
    host_bytes 0: no host tier; disk_dir None: no disk tier."""

    fast_bytes: int = 1 * GiB
    host_bytes: int = 0
    disk_dir: Path | None = None
    disk_bytes: int = 16 * GiB
    spill: str = "slide"
    spill_options: dict[str, Any] = field(default_factory=dict)
    page_size: int = 16
    fsync: bool = True
    # the disk journal is compacted once it holds this many lines and 4x the live records
    journal_compact_lines: int = 4096
    decoupled_load: bool = True  # per-layer loader thread during selective prefill
    adopt_recomputed: bool = True  # recomputed/fused tokens of a reused segment update it

    def __post_init__(self) -> None:
        policy = SPILL_POLICIES.get(self.spill)  # unknown names list the known ones
        if min(self.fast_bytes, self.host_bytes, self.disk_bytes) < 0 or self.page_size < 1:
            raise ConfigError("tier capacities must be >= 0 and page_size >= 1")
        if not isinstance(self.spill_options, Mapping):
            raise ConfigError(
                f"spill_options must be a dict of options, got {type(self.spill_options).__name__}"
            )
        try:  # here, not when the engine starts
            policy(**self.spill_options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"spill_options for {self.spill!r}: {e}") from e

    def check_working_set(self, token_bytes: int, tokens: int) -> None:
        """Fail at start-up when the fast tier, or the lowest tier (which keeps only segments
        that fit in it), cannot hold one request's reused KV."""
        need = token_bytes * tokens
        tiers = [("fast", self.fast_bytes)]
        if self.disk_dir is not None:
            tiers.append(("disk", self.disk_bytes))
        elif self.host_bytes:
            tiers.append(("host", self.host_bytes))
        for name, capacity in tiers:
            if capacity < need:
                raise TierCapacityError(
                    f"{name} tier of {capacity} bytes cannot hold one request's working set "
                    f"({tokens} tokens x {token_bytes} bytes = {need}); raise {name}_bytes to "
                    "at least that, or lower kv_pages"
                )


@dataclass
class TierStats:
    spills: int = 0  # tier-full events that asked the spill policy
    dropped_clean: int = 0  # pages dropped without a write
    written_pages: int = 0  # pages written to a lower tier by spills
    # K/V bytes the disk tier lacked when written: a page with no disk copy counts whole, one
    # with a stale copy counts its stale slots, a current copy nothing
    persist_required_bytes: int = 0
    persist_required_page_bytes: int = 0  # the same counting every page not current whole
    failed_spills: int = 0
    unpromoted: int = 0  # pages served from a lower tier and left there (no room above)
    updates: int = 0  # pages replaced by a newer version
    whole_updates: int = 0  # ... of which no current copy could be read to merge into
    errors: list[str] = field(default_factory=list)  # last tier errors, newest last
    invalid_records: int = 0  # segment index records on disk that were malformed (dropped)


@dataclass
class _Page:
    segment: SegmentKey
    index: int
    num_tokens: int
    nbytes: int
    stale: dict[str, int]  # a key per tier holding a copy of the page
    last_use: int
    seq: int = 0  # order the store came to hold the page in (spill candidates are in it)


@dataclass
class _Segment:
    cid: str
    model_id: str
    tokenizer_id: str
    context_id: str | None
    pages: list[PageKey]
    committed: bool = False  # every page has a current disk copy and the index says so

    def record(self) -> dict[str, Any]:
        return {"cid": self.cid, "model": self.model_id, "tok": self.tokenizer_id,
                "context": self.context_id, "pages": list(self.pages)}  # fmt: skip

    @classmethod
    def from_record(cls, rec: Any) -> _Segment | None:
        """A committed segment from its index record (None: not a record `record` writes)."""
        if not isinstance(rec, dict):
            return None
        cid, model, tok = rec.get("cid"), rec.get("model"), rec.get("tok")
        context, pages = rec.get("context"), rec.get("pages")
        if not (isinstance(cid, str) and isinstance(model, str) and isinstance(tok, str)):
            return None
        if not isinstance(pages, list) or not all(isinstance(k, str) for k in pages):
            return None
        if context is not None and not isinstance(context, str):
            return None
        return cls(cid, model, tok, context, [PageKey(k) for k in pages], committed=True)


class _NoRoom(Exception):
    pass


def _slots(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


class TieredSegmentStore(SegmentStore):
    """A SegmentStore whose entries live as pages in tiers; see the module docstring.
    `capacity_bytes` is the sum of the tiers' capacities; segments leave the store only when
    the lowest tier is full. A lookup returns new tensors, assembled from the pages."""

    def __init__(
        self, config: TierConfig, policy: EvictionPolicy | str = "lru", device: str = "cpu"
    ) -> None:
        pin = torch.cuda.is_available()
        tiers: list[Tier] = [MemoryTier("fast", config.fast_bytes, device)]
        if config.host_bytes:
            tiers.append(MemoryTier("host", config.host_bytes, "cpu", pin=pin))
        if config.disk_dir is not None:
            tiers.append(
                DiskTier(
                    config.disk_dir, config.disk_bytes, config.fsync, config.journal_compact_lines
                )
            )
        self.capacity_bytes = sum(t.capacity_bytes for t in tiers)
        self.policy = EVICTION_POLICIES.get(policy)() if isinstance(policy, str) else policy
        self.stats = StoreStats()
        self.config = config
        self.tiers = tiers
        self.spill_policy: SpillPolicy = SPILL_POLICIES.get(config.spill)(**config.spill_options)
        self.tier_stats = TierStats()
        self._segments: dict[SegmentKey, _Segment] = {}
        self._pages: dict[PageKey, _Page] = {}
        self._pinned: set[SegmentKey] = set()
        self._clock = itertools.count(1)
        self._seq = itertools.count()
        self._below = [[t.name for t in tiers[i + 1 :]] for i in range(len(tiers))]
        self._ledger = MissLedger()
        self._lock = threading.RLock()
        # the lowest tier when durable: segments are committed there and recovered from it
        self._durable: Tier | None = tiers[-1] if tiers[-1].durable else None
        if self._durable is not None:
            self._recover(self._durable)

    # ---- the SegmentStore API ----

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        with self._lock:
            return store_key(model_id, tokenizer_id, cid) in self._segments

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        key = store_key(model_id, tokenizer_id, cid)
        with self._lock:
            seg = self._segments.get(key)
            if seg is None or (seg.model_id, seg.tokenizer_id) != (model_id, tokenizer_id):
                self.stats.misses += 1
                return Lookup(None, self._ledger.reason(key, cid, model_id, tokenizer_id))
            pages = self._read_pages(seg)
            if pages is None:
                self._forget(key)
                self.stats.misses += 1
                return Lookup(None, MissReason.CHECKSUM)
            self.stats.hits += 1
            self.policy.on_access(key)
            self._promote(key, seg, pages)
            return Lookup(self._assemble(seg, [p for _, p in pages]), None)

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        key = store_key(kv.model_id, kv.tokenizer_id, cid)
        with self._lock:
            if key in self._segments:
                self.policy.on_access(key)
                return True
            pages = self._split(key, kv)
            if kv.nbytes > min(self.tiers[0].capacity_bytes, self.tiers[-1].capacity_bytes):
                self.stats.rejected += 1
                return False
            with self._pin(key):
                try:
                    self._make_room(0, kv.nbytes)
                except _NoRoom:
                    self.stats.rejected += 1
                    return False
            self.tiers[0].write(pages)
            now = next(self._clock)
            for (pk, page), i in zip(pages, itertools.count(), strict=False):
                self._pages[pk] = _Page(key, i, page.num_tokens, page.nbytes, {"fast": 0}, now,
                                        next(self._seq))  # fmt: skip
            seg = _Segment(cid, kv.model_id, kv.tokenizer_id, kv.context_id, [k for k, _ in pages])
            self._add_segment(key, seg, kv.nbytes)
            return True

    def clear(self) -> None:
        with self._lock:
            for key in list(self._segments):
                self._forget(key)
            self._ledger.clear()  # clear() is not an eviction: no history is kept

    # ---- tiers ----

    def update_pages(
        self, model_id: str, tokenizer_id: str, cid: str, updates: dict[int, tuple[PageData, int]]
    ) -> bool:
        """Give pages of a stored segment a newer version in the fast tier: index -> (K/V and
        positions of the page's tokens, bit mask of the slots that changed). Only the masked
        slots are taken; the rest of the page stays as stored. Lower copies become stale at
        those slots. False if the segment is not stored (or the pages do not fit in fast)."""
        key = store_key(model_id, tokenizer_id, cid)
        with self._lock:
            seg = self._segments.get(key)
            if seg is None or not updates:
                return False
            for i, (page, changed) in updates.items():
                n = self._pages[seg.pages[i]].num_tokens
                if page.num_tokens != n or not 0 < changed < 1 << n:
                    raise ValueError(
                        f"update of page {i}: {page.num_tokens} tokens and slot mask "
                        f"{changed:#x} for a page of {n} tokens"
                    )
            updates = {i: self._merged(seg.pages[i], page, changed)
                       for i, (page, changed) in updates.items()}  # fmt: skip
            writes = [(seg.pages[i], page) for i, (page, _) in sorted(updates.items())]
            absent = sum(p.nbytes for k, p in writes if k not in self.tiers[0])
            with self._pin(key):
                try:
                    self._make_room(0, absent)
                except _NoRoom:
                    return False
            self.tiers[0].write(writes, owned=True)  # merged pages are copies of our own
            seg.context_id = None  # pages now hold KV computed in different contexts
            now = next(self._clock)
            for i, (_, changed) in updates.items():
                state = self._pages[seg.pages[i]]
                for tier in list(state.stale):
                    state.stale[tier] |= changed
                state.stale["fast"] = 0
                state.last_use = now
                self.tier_stats.updates += 1
            return True

    def _merged(self, pk: PageKey, page: PageData, changed: int) -> tuple[PageData, int]:
        """The current version of `pk` with the slots in `changed` taken from `page` (a new
        copy, the store's own); when no current copy can be read (a corrupt disk page), a
        copy of `page` whole, all slots changed."""
        current = self._read_current(pk)  # a copy: placing slots into a view would change it
        if current is None:
            self.tier_stats.whole_updates += 1
            whole = PageData(page.keys.clone(), page.values.clone(), page.positions.clone())
            return whole, (1 << page.num_tokens) - 1
        slots = _slots(changed)
        current.place(slots, page.take(slots))
        return current, changed

    def persist(self) -> int:
        """Write every page without a current disk copy to disk (copies stay where they
        are), one write call per segment, and commit the segments; returns pages written.
        Raises TierError when the disk tier fails or has no room."""
        disk = self._durable
        if disk is None:
            raise ValueError("persist() needs a disk tier (TierConfig.disk_dir)")
        written = 0
        with self._lock:
            for key, seg in list(self._segments.items()):
                if key not in self._segments:  # evicted to make room for an earlier one
                    continue
                todo = [k for k in seg.pages if self._pages[k].stale.get(disk.name) != 0]
                if todo:
                    with self._pin(key):
                        try:
                            self._make_room(len(self.tiers) - 1, self._bytes(todo, disk))
                        except _NoRoom as e:
                            raise TierError(f"persist: {e}") from e
                    pages = [(k, self._read_current(k, view=True)) for k in todo]
                    self._write_below(disk, [(k, p) for k, p in pages if p is not None])
                    written += len(todo)
                self._commit(key, seg)
        return written

    def demote_all(self) -> None:
        """Persist, then drop every copy above the disk tier: the state of a store whose KV
        was all spilled (what a TTFT-from-disk measurement starts from)."""
        self.persist()  # the lowest tier is durable, or this raised
        durable = self.tiers[-1].name
        with self._lock:
            for tier in self.tiers[:-1]:
                keys = [
                    pk
                    for pk, s in self._pages.items()
                    if tier.name in s.stale and s.stale.get(durable) == 0
                ]
                tier.drop(keys)
                for pk in keys:
                    del self._pages[pk].stale[tier.name]

    def page_info(self, model_id: str, tokenizer_id: str, cid: str) -> list[PageInfo]:
        """Each page of a stored segment as its fastest tier's spill policy would see it."""
        key = store_key(model_id, tokenizer_id, cid)
        with self._lock:
            seg = self._segments.get(key)
            if seg is None:
                return []
            out = []
            for pk in seg.pages:
                stale = self._pages[pk].stale
                level = next(i for i, t in enumerate(self.tiers) if stale.get(t.name) == 0)
                out.append(self._info(pk, level))
            return out

    def close(self) -> None:
        """Close every tier (the disk tier releases its folder to the next process)."""
        for tier in self.tiers:
            tier.close()

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def counters(self) -> dict[str, dict[str, int]]:
        return {t.name: dict(vars(t.counters)) for t in self.tiers}

    # ---- internals: reading ----

    def _read_pages(self, seg: _Segment) -> list[tuple[PageKey, PageData]] | None:
        """The segment's current pages, read-only (views: promoted and concatenated, never
        changed)."""
        out = []
        for pk in seg.pages:
            page = self._read_current(pk, count_hit=True, view=True)
            if page is None:
                return None
            out.append((pk, page))
        return out

    def _read_current(
        self, pk: PageKey, count_hit: bool = False, view: bool = False
    ) -> PageData | None:
        """The page's current version from its fastest current copy; `view`: read-only (the
        tier's own tensors where it holds them in memory), else a copy the caller may change."""
        state = self._pages[pk]
        for tier in self.tiers:
            if state.stale.get(tier.name) == 0:
                page = tier.view(pk) if view else tier.read(pk)
                if page is not None and count_hit:
                    tier.counters.hits += 1
                return page
        return None

    def _promote(
        self, key: SegmentKey, seg: _Segment, pages: list[tuple[PageKey, PageData]]
    ) -> None:
        now = next(self._clock)
        for pk in seg.pages:
            self._pages[pk].last_use = now
        lower = [(k, p) for k, p in pages if k not in self.tiers[0]]
        if not lower:
            return
        with self._pin(key):
            try:
                self._make_room(0, sum(p.nbytes for _, p in lower))
            except _NoRoom:
                self.tier_stats.unpromoted += len(lower)
                return
        self.tiers[0].write(lower, owned=True)  # views, never changed: kept without a copy
        for k, _ in lower:
            self._pages[k].stale["fast"] = 0

    def _assemble(self, seg: _Segment, pages: list[PageData]) -> StoredKV:
        return StoredKV(
            torch.cat([p.keys.cpu() for p in pages], dim=1),
            torch.cat([p.values.cpu() for p in pages], dim=1),
            torch.cat([p.positions for p in pages]),
            seg.model_id,
            seg.tokenizer_id,
            seg.context_id,
        )

    def _split(self, key: SegmentKey, kv: StoredKV) -> list[tuple[PageKey, PageData]]:
        n = self.config.page_size
        return [
            (PageKey(f"{key}/{i // n}"),
             PageData(kv.keys[:, i : i + n], kv.values[:, i : i + n], kv.positions[i : i + n]))
            for i in range(0, kv.num_tokens, n)
        ]  # fmt: skip

    # ---- internals: making room ----

    def _make_room(self, level: int, need: int) -> None:
        """Free `need` bytes in tier `level` (spill, or evict segments at the lowest tier);
        raises _NoRoom when it cannot."""
        tier = self.tiers[level]
        if tier.free_bytes >= need:
            return
        if level == len(self.tiers) - 1:
            self._evict_segments(tier, need)
            return
        self.tier_stats.spills += 1
        candidates = [self._info(pk, level) for pk in self._resident(level)]
        plan = self.spill_policy.plan(candidates, need - tier.free_bytes)
        self._check_plan(plan, {c.key: c for c in candidates})
        tier.drop([PageKey(k) for k in plan.drops])
        for k in plan.drops:
            del self._pages[PageKey(k)].stale[tier.name]
        self.tier_stats.dropped_clean += len(plan.drops)
        below = self.tiers[level + 1]
        for extent in plan.extents:
            keys = [PageKey(k) for k in extent]
            try:
                # full size: making room below may drop the extent's own outdated copies
                self._make_room(level + 1, sum(self._pages[k].nbytes for k in keys))
                keys = [k for k in keys if k in self._pages]  # eviction below may take some
                pages = [(k, p) for k in keys if (p := tier.view(k)) is not None]
                self._write_below(below, pages)
            except (_NoRoom, TierError) as e:
                self.tier_stats.failed_spills += 1
                self._error(str(e) or f"no room in the {below.name} tier")
                break
            tier.drop(keys)
            for k in keys:
                del self._pages[k].stale[tier.name]
        if tier.free_bytes < need:
            raise _NoRoom(f"{tier.name} tier is full")

    def _write_below(self, below: Tier, pages: list[tuple[PageKey, PageData]]) -> None:
        if not pages:
            return
        deltas: dict[PageKey, list[int]] = {}
        durable = below is self._durable
        if durable:
            st = self.tier_stats
            for k, p in pages:
                stale = self._pages[k].stale.get(below.name)
                if stale == 0:
                    continue
                st.persist_required_page_bytes += p.nbytes
                n = stale.bit_count() if stale is not None else p.num_tokens
                st.persist_required_bytes += p.nbytes * n // p.num_tokens
                if stale is not None and self.spill_policy.deltas:
                    deltas[k] = _slots(stale)
        below.write(pages, deltas, owned=True)  # views of the tier above, never changed
        self.tier_stats.written_pages += len(pages)
        for k, _ in pages:
            self._pages[k].stale[below.name] = 0
        if durable:
            for seg_key in {self._pages[k].segment for k, _ in pages}:
                self._commit(seg_key, self._segments[seg_key])

    def _commit(self, key: SegmentKey, seg: _Segment) -> None:
        disk = self._durable
        if seg.committed or disk is None:
            return
        if all(self._pages[k].stale.get(disk.name) == 0 for k in seg.pages):
            disk.put_meta(f"seg:{key}", seg.record())
            seg.committed = True

    def _evict_segments(self, tier: Tier, need: int) -> None:
        skipped = []
        while tier.free_bytes < need:
            victim = self.policy.victim()
            if victim is None:
                break
            key = SegmentKey(victim)
            if key in self._pinned:  # being served: skip it this round
                self.policy.on_remove(key)
                skipped.append(key)
                continue
            self._forget(key)
            self.stats.evictions += 1
        for key in skipped:
            self.policy.on_insert(key, 0)
        if tier.free_bytes < need:
            raise _NoRoom(f"the {tier.name} tier cannot make room")

    def _info(self, pk: PageKey, level: int) -> PageInfo:
        """The page as tier `level`'s spill policy sees it: clean when its copy there is
        outdated or a tier below holds a current copy; else dirty by the fewest stale slots
        of any copy below (all its tokens when there is none)."""
        state = self._pages[pk]
        stale = state.stale
        clean = stale[self.tiers[level].name] > 0  # outdated
        dirty = state.num_tokens
        for name in self._below[level]:
            mask = stale.get(name)
            if mask is None:
                continue
            if mask == 0:
                clean = True
                break
            dirty = min(dirty, mask.bit_count())
        return PageInfo(
            pk, state.segment, state.index, state.nbytes, 0 if clean else dirty, clean,
            state.last_use,
        )  # fmt: skip

    def _check_plan(self, plan: SpillPlan, candidates: dict[str, PageInfo]) -> None:
        keys = plan.keys
        if len(set(keys)) != len(keys) or not set(keys) <= set(candidates):
            raise RuntimeError(f"{type(self.spill_policy).__name__} broke the spill contract")
        if any(not candidates[k].clean for k in plan.drops):
            raise RuntimeError(f"{type(self.spill_policy).__name__} dropped a dirty page")

    def _resident(self, level: int) -> list[PageKey]:
        """Spill candidates of tier `level`. Pages of pinned segments (being put, served or
        updated) stay in fast; below it they may move further down, never out."""
        pages = self._pages
        held = self.tiers[level].page_keys()  # the pages with a copy there (a stale key)
        return sorted(
            (pk for pk in held if level > 0 or pages[pk].segment not in self._pinned),
            key=lambda pk: pages[pk].seq,
        )

    def _bytes(self, keys: Sequence[PageKey], tier: Tier) -> int:
        return sum(self._pages[k].nbytes for k in keys if k not in tier)

    @contextmanager
    def _pin(self, key: SegmentKey) -> Iterator[None]:
        added = key not in self._pinned
        self._pinned.add(key)
        try:
            yield
        finally:
            if added:
                self._pinned.discard(key)

    def _error(self, message: str) -> None:
        self.tier_stats.errors = [*self.tier_stats.errors[-9:], message]

    # ---- internals: bookkeeping ----

    def _add_segment(self, key: SegmentKey, seg: _Segment, nbytes: int) -> None:
        self._segments[key] = seg
        self._ledger.stored(key, seg.cid, seg.model_id, seg.tokenizer_id)
        self.policy.on_insert(key, nbytes)
        self.stats.entries += 1
        self.stats.bytes += nbytes
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)

    def _forget(self, key: SegmentKey) -> None:
        """Remove a segment from every tier (eviction, a corrupt page, clear); the ledger
        remembers it, so a lookup says it was stored once."""
        seg = self._segments.pop(key)
        for tier in self.tiers:
            tier.drop(seg.pages)
        nbytes = sum(self._pages.pop(k).nbytes for k in seg.pages)
        if self._durable is not None:
            self._durable.drop_meta(f"seg:{key}")
        self.policy.on_remove(key)
        self.stats.entries -= 1
        self.stats.bytes -= nbytes
        self._ledger.evicted(key, seg.model_id, seg.tokenizer_id)

    def _recover(self, disk: Tier) -> None:
        """Rebuild the index of committed segments from the disk tier after a restart;
        pages no committed segment names are dropped."""
        named: set[str] = set()
        for name, rec in list(disk.meta.items()):
            if not name.startswith("seg:"):
                continue
            key = SegmentKey(name[4:])
            seg = _Segment.from_record(rec)
            if seg is None:
                self.tier_stats.invalid_records += 1
            if seg is None or not all(k in disk for k in seg.pages):
                disk.drop_meta(name)
                continue
            pages = seg.pages
            nbytes = 0
            for i, pk in enumerate(pages):
                num_tokens, kv_bytes = disk.page_size_of(pk)
                self._pages[pk] = _Page(key, i, num_tokens, kv_bytes, {disk.name: 0}, 0,
                                        next(self._seq))  # fmt: skip
                nbytes += kv_bytes
            named.update(pages)
            self._add_segment(key, seg, nbytes)
        disk.drop([k for k in disk.page_keys() if k not in named])
