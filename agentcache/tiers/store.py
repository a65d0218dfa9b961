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

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace

import torch

from agentcache.kv.retention import PinResult, RetainingStore, RetentionStats, check_shares
from agentcache.kv.store import Lookup, MissReason, SegmentKey, SegmentStore, StoredKV, store_key
from agentcache.policy.eviction import EvictionPolicy
from agentcache.policy.spill import PageInfo
from agentcache.tiers.base import PageData, PageKey, Tier, TierError
from agentcache.tiers.config import TierConfig
from agentcache.tiers.entries import SegmentEntry, mask_slots
from agentcache.tiers.placement import NoRoom, TierPlacement


class TieredSegmentStore(SegmentStore, RetainingStore):
    """A SegmentStore whose entries live as pages in tiers; see the module docstring.
    `capacity_bytes` is the sum of the tiers' capacities; segments leave the store only when
    the lowest tier is full. A lookup returns new tensors, assembled from the pages. Every
    public method holds the store's lock (`locked()`) while it runs."""

    def __init__(
        self, config: TierConfig, policy: EvictionPolicy | str = "lru", device: str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """`clock`: seconds, the time retentions expire on."""
        self._placement = at = TierPlacement(config, policy, device, clock)
        self.config, self.tiers, self.capacity_bytes = config, at.tiers, at.capacity_bytes
        self.policy, self.spill_policy = at.policy, at.spill_policy
        self.stats, self.tier_stats = at.stats, at.tier_stats
        self._lock = threading.RLock()
        if at.durable is not None:
            self._recover(at.durable)

    def locked(self) -> AbstractContextManager[bool]:
        """The store's lock (re-entrant): calls made while it is held see no other thread's
        calls in between."""
        return self._lock

    # ---- the SegmentStore API ----

    def contains_content(self, model_id: str, tokenizer_id: str, cid: str) -> bool:
        with self._lock:
            return self._placement.segment(store_key(model_id, tokenizer_id, cid)) is not None

    def lookup_content(self, model_id: str, tokenizer_id: str, cid: str) -> Lookup:
        key = store_key(model_id, tokenizer_id, cid)
        at = self._placement
        with self._lock:
            seg = at.segment(key)
            if seg is None or (seg.model_id, seg.tokenizer_id) != (model_id, tokenizer_id):
                self.stats.misses += 1
                return Lookup(None, at.miss_reason(key, cid, model_id, tokenizer_id))
            pages = self._read_pages(seg)
            if pages is None:
                at.forget(key)
                self.stats.misses += 1
                return Lookup(None, MissReason.CHECKSUM)
            self.stats.hits += 1
            self.policy.on_access(key)
            self._promote(key, seg, pages)
            return Lookup(self._assemble(seg, [p for _, p in pages]), None)

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        key = store_key(kv.model_id, kv.tokenizer_id, cid)
        at = self._placement
        with self._lock:
            if at.segment(key) is not None:
                self.policy.on_access(key)
                return True
            pages = self._split(key, kv)
            if kv.nbytes > min(self.tiers[0].capacity_bytes, self.tiers[-1].capacity_bytes):
                self.stats.rejected += 1
                return False
            with at.pin(key):
                try:
                    at.make_room(0, kv.nbytes)
                except NoRoom:
                    self.stats.rejected += 1
                    return False
            self.tiers[0].write(pages)
            seg = SegmentEntry(
                cid, kv.model_id, kv.tokenizer_id, kv.context_id, [k for k, _ in pages]
            )
            sizes = [(page.num_tokens, page.nbytes) for _, page in pages]
            at.add_segment(key, seg, sizes, self.tiers[0].name, used=True)
            return True

    def clear(self) -> None:
        with self._lock:
            self._placement.clear()

    # ---- retention across tool pauses (agentcache/kv/retention.py) ----

    def retain(
        self, model_id: str, tokenizer_id: str, cids: Sequence[str], seconds: float,
        owner: Hashable = None,
    ) -> PinResult:  # fmt: skip
        """Keep these stored segments (a conversation's) for `seconds` from now: their pages
        stay in the fast tier while the retained bytes stay within `TierConfig.retain_share`
        of it (segments beyond that are refused, in `PinResult.refused`, and left to the
        spill policy), and no retained segment is evicted from the store before it expires;
        an expired retention protects nothing. Segments the store does not hold are refused.
        `seconds` is checked by the caller (`parse_retention`). Retaining again extends."""
        at = self._placement
        with self._lock:
            sizes, absent = [], []
            for cid in cids:
                key = store_key(model_id, tokenizer_id, cid)
                seg = at.segment(key)
                if seg is None:
                    absent.append(key)
                    continue
                sizes.append((key, sum(at.page(pk).nbytes for pk in seg.pages)))
            got = at.retained.pin(sizes, seconds, at.clock(), owner)
            return replace(got, refused=(*got.refused, *absent))

    def release(self, model_id: str, tokenizer_id: str, cids: Sequence[str]) -> None:
        with self._lock:
            self._placement.retained.unpin([store_key(model_id, tokenizer_id, c) for c in cids])

    def set_retain_share(
        self, share: float, owner_share: float = 1.0, owner_reserve: float = 0.0
    ) -> None:
        """Of the fast tier's bytes (`TierConfig.retain_share` until set)."""
        check_shares(share, owner_share, owner_reserve)
        with self._lock:
            fast = int(share * self.config.fast_bytes)
            self._placement.retained.bound(fast, owner_share, owner_reserve)

    def retention_stats(self) -> RetentionStats:
        at = self._placement
        with self._lock:
            return at.retained.stats(at.clock())

    def prefetch(self, model_id: str, tokenizer_id: str, cids: Sequence[str]) -> int:
        """Bring these segments' pages up to the fast tier ahead of the request that reads
        them (the conversation's next turn); returns the pages moved up. A segment that is
        gone or fails its checksum is skipped (its lookup will say why); no hit is counted."""
        moved = 0
        at = self._placement
        with self._lock:
            for cid in cids:
                key = store_key(model_id, tokenizer_id, cid)
                seg = at.segment(key)
                if seg is None:
                    continue
                lower = [pk for pk in seg.pages if pk not in self.tiers[0]]
                pages = self._read_pages(seg, count_hit=False)
                if pages is None or not lower:
                    continue
                self._promote(key, seg, pages)
                moved += sum(pk in self.tiers[0] for pk in lower)
            self.tier_stats.prefetched_pages += moved
        return moved

    # ---- tiers ----

    def update_pages(
        self, model_id: str, tokenizer_id: str, cid: str, updates: dict[int, tuple[PageData, int]]
    ) -> bool:
        """Give pages of a stored segment a newer version in the fast tier: index -> (K/V and
        positions of the page's tokens, bit mask of the slots that changed). Only the masked
        slots are taken; the rest of the page stays as stored. Lower copies become stale at
        those slots. False if the segment is not stored (or the pages do not fit in fast)."""
        key = store_key(model_id, tokenizer_id, cid)
        at = self._placement
        with self._lock:
            seg = at.segment(key)
            if seg is None or not updates:
                return False
            for i, (page, changed) in updates.items():
                n = at.page(seg.pages[i]).num_tokens
                if page.num_tokens != n or not 0 < changed < 1 << n:
                    raise ValueError(
                        f"update of page {i}: {page.num_tokens} tokens and slot mask "
                        f"{changed:#x} for a page of {n} tokens"
                    )
            updates = {i: self._merged(seg.pages[i], page, changed)
                       for i, (page, changed) in updates.items()}  # fmt: skip
            writes = [(seg.pages[i], page) for i, (page, _) in sorted(updates.items())]
            absent = sum(p.nbytes for k, p in writes if k not in self.tiers[0])
            with at.pin(key):
                try:
                    at.make_room(0, absent)
                except NoRoom:
                    return False
            self.tiers[0].write(writes, owned=True)  # merged pages are copies of our own
            seg.context_id = None  # pages now hold KV computed in different contexts
            at.mark_updated({seg.pages[i]: changed for i, (_, changed) in updates.items()})
            return True

    def _merged(self, pk: PageKey, page: PageData, changed: int) -> tuple[PageData, int]:
        """The current version of `pk` with the slots in `changed` taken from `page` (a new
        copy, the store's own); when no current copy can be read (a corrupt disk page), a
        copy of `page` whole, all slots changed."""
        current = self._placement.read_current(
            pk
        )  # a copy: placing slots into a view would change it
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
        at = self._placement
        disk = at.durable
        if disk is None:
            raise ValueError("persist() needs a disk tier (TierConfig.disk_dir)")
        written = 0
        with self._lock:
            for key in at.segment_keys():
                seg = at.segment(key)
                if seg is None:  # evicted to make room for an earlier one
                    continue
                todo = [k for k in seg.pages if at.page(k).stale.get(disk.name) != 0]
                if todo:
                    with at.pin(key):
                        try:
                            at.make_room(len(self.tiers) - 1, at.missing_bytes(todo, disk))
                        except NoRoom as e:
                            raise TierError(f"persist: {e}") from e
                    pages = [(k, at.read_current(k, view=True)) for k in todo]
                    at.write_below(disk, [(k, p) for k, p in pages if p is not None])
                    written += len(todo)
                at.commit(key, seg)
        return written

    def demote_all(self) -> None:
        """Persist, then drop every copy above the disk tier: the state of a store whose KV
        was all spilled (what a TTFT-from-disk measurement starts from)."""
        self.persist()  # the lowest tier is durable, or this raised
        with self._lock:
            self._placement.drop_above_lowest()

    def page_info(self, model_id: str, tokenizer_id: str, cid: str) -> list[PageInfo]:
        """Each page of a stored segment as its fastest tier's spill policy would see it."""
        key = store_key(model_id, tokenizer_id, cid)
        at = self._placement
        with self._lock:
            seg = at.segment(key)
            if seg is None:
                return []
            out = []
            for pk in seg.pages:
                stale = at.page(pk).stale
                level = next(i for i, t in enumerate(self.tiers) if stale.get(t.name) == 0)
                out.append(at.info(pk, level))
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

    def _read_pages(
        self, seg: SegmentEntry, count_hit: bool = True
    ) -> list[tuple[PageKey, PageData]] | None:
        """The segment's current pages, read-only (views: promoted and concatenated, never
        changed)."""
        out = []
        for pk in seg.pages:
            page = self._placement.read_current(pk, count_hit=count_hit, view=True)
            if page is None:
                return None
            out.append((pk, page))
        return out

    def _promote(
        self, key: SegmentKey, seg: SegmentEntry, pages: list[tuple[PageKey, PageData]]
    ) -> None:
        at = self._placement
        at.touch(seg)
        lower = [(k, p) for k, p in pages if k not in self.tiers[0]]
        if not lower:
            return
        with at.pin(key):
            try:
                at.make_room(0, sum(p.nbytes for _, p in lower))
            except NoRoom:
                self.tier_stats.unpromoted += len(lower)
                return
        self.tiers[0].write(lower, owned=True)  # views, never changed: kept without a copy
        at.mark_current([k for k, _ in lower], self.tiers[0].name)

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
            sizes = [disk.page_size_of(pk) for pk in seg.pages]
            named.update(seg.pages)
            self._placement.add_segment(key, seg, sizes, disk.name, used=False)
        disk.drop([k for k in disk.page_keys() if k not in named])
