"""Tiered segment store: segment KV as pages in fast / host / disk tiers.

An implementation of the `SegmentStore` seam (agentcache/kv/store.py holds its contract), so
every strategy uses it unchanged. What it adds:

    put      : the segment's pages go to the fast tier (room made by spilling)
    lookup   : pages are read from the fastest tier holding their current version and
               promoted back to fast; a page failing its checksum makes the lookup a
               CHECKSUM miss and forgets the segment (recomputed, never served)
    update   : a newer version of some pages (tokens recomputed or fused during reuse) lands
               in fast; lower copies become stale by that many tokens (the page is dirty)
    persist  : every page gets a current disk copy; segments are committed to the disk index

Where copies live, spilling and eviction: `TierPlacement` (agentcache/tiers/placement.py).

An update changes only the slots it names: the new version is the current one with those
slots replaced (keys, values and the positions their keys are rotated at), so a lower copy
differs from the current version exactly at its stale slots.
"""

from __future__ import annotations

import itertools

import torch

from agentcache.kv.store import Lookup, MissReason, SegmentKey, SegmentStore, StoredKV, store_key
from agentcache.policy.eviction import EvictionPolicy
from agentcache.policy.spill import PageInfo
from agentcache.tiers.base import PageData, PageKey, Tier, TierError
from agentcache.tiers.config import TierConfig
from agentcache.tiers.placement import NoRoom, PageState, SegmentEntry, TierPlacement, mask_slots


class TieredSegmentStore(TierPlacement, SegmentStore):
    """A SegmentStore whose entries live as pages in tiers; see the module docstring.
    `capacity_bytes` is the sum of the tiers' capacities; segments leave the store only when
    the lowest tier is full. A lookup returns new tensors, assembled from the pages."""

    def __init__(
        self, config: TierConfig, policy: EvictionPolicy | str = "lru", device: str = "cpu"
    ) -> None:
        super().__init__(config, policy, device)
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
                except NoRoom:
                    self.stats.rejected += 1
                    return False
            self.tiers[0].write(pages)
            now = next(self._clock)
            for (pk, page), i in zip(pages, itertools.count(), strict=False):
                self._pages[pk] = PageState(key, i, page.num_tokens, page.nbytes, {"fast": 0}, now,
                                        next(self._seq))  # fmt: skip
            seg = SegmentEntry(
                cid, kv.model_id, kv.tokenizer_id, kv.context_id, [k for k, _ in pages]
            )
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
                except NoRoom:
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
        slots = mask_slots(changed)
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
                        except NoRoom as e:
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

    def _read_pages(self, seg: SegmentEntry) -> list[tuple[PageKey, PageData]] | None:
        """The segment's current pages, read-only (views: promoted and concatenated, never
        changed)."""
        out = []
        for pk in seg.pages:
            page = self._read_current(pk, count_hit=True, view=True)
            if page is None:
                return None
            out.append((pk, page))
        return out

    def _promote(
        self, key: SegmentKey, seg: SegmentEntry, pages: list[tuple[PageKey, PageData]]
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
            except NoRoom:
                self.tier_stats.unpromoted += len(lower)
                return
        self.tiers[0].write(lower, owned=True)  # views, never changed: kept without a copy
        for k, _ in lower:
            self._pages[k].stale["fast"] = 0

    def _assemble(self, seg: SegmentEntry, pages: list[PageData]) -> StoredKV:
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

    # ---- internals: recovery ----

    def _recover(self, disk: Tier) -> None:
        """Rebuild the index of committed segments from the disk tier after a restart;
        pages no committed segment names are dropped."""
        named: set[str] = set()
        for name, rec in list(disk.meta.items()):
            if not name.startswith("seg:"):
                continue
            key = SegmentKey(name[4:])
            seg = SegmentEntry.from_record(rec)
            if seg is None:
                self.tier_stats.invalid_records += 1
            if seg is None or not all(k in disk for k in seg.pages):
                disk.drop_meta(name)
                continue
            pages = seg.pages
            nbytes = 0
            for i, pk in enumerate(pages):
                num_tokens, kv_bytes = disk.page_size_of(pk)
                self._pages[pk] = PageState(key, i, num_tokens, kv_bytes, {disk.name: 0}, 0,
                                        next(self._seq))  # fmt: skip
                nbytes += kv_bytes
            named.update(pages)
            self._add_segment(key, seg, nbytes)
        disk.drop([k for k in disk.page_keys() if k not in named])
