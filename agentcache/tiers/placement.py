"""Where each page's copies live, and making room: the index under `TieredSegmentStore`.

(One class of ~320 lines: every move below changes the same page states under one invariant,
that the fastest copy of a page is current; the records it keeps are in entries.py.)

    spill    : a full tier asks the spill policy for victims: clean pages are dropped, the
               rest written to the tier below, one write call per extent
    evict    : the lowest tier, when full, drops whole segments in eviction-policy order

Per page, `stale[tier]` is a bit mask of the token slots whose K/V the copy in that tier
lacks (absent: no copy; bit i: the page's token i). The fastest copy is always current
(stale 0). A page is clean in tier i when its copy there is outdated (a newer one lives
above) or some tier below holds a current copy; its dirty count is the fewest stale slots of
any copy below. A spill policy with `deltas` writes a dirty page to the disk tier as a delta
of its stale slots instead of whole.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from agentcache.kv.retention import PinTable
from agentcache.kv.store import MissLedger, MissReason, SegmentKey, StoreStats
from agentcache.policy.eviction import EVICTION_POLICIES, EvictionPolicy
from agentcache.policy.spill import SPILL_POLICIES, PageInfo, SpillPlan, SpillPolicy
from agentcache.tiers.base import PageData, PageKey, Tier, TierError
from agentcache.tiers.config import TierConfig, TierStats
from agentcache.tiers.disk import DiskTier
from agentcache.tiers.entries import PageState, SegmentEntry, mask_slots
from agentcache.tiers.memory import MemoryTier


class NoRoom(Exception):
    """A tier cannot free the bytes asked for."""


class TierPlacement:
    """The page and segment index over the tiers, pins, spilling down and eviction at the
    lowest tier; see the module docstring. Not thread-safe: its owner, `TieredSegmentStore`,
    calls it with the store's lock held.

    Pages and segments enter through `add_segment` and leave through `forget` (or `clear`);
    copies move through `make_room` (spill, evict), `write_below`, `mark_current`,
    `mark_updated` and `drop_above_lowest`. `page` and `segment` are for reading only.
    """

    def __init__(
        self, config: TierConfig, policy: EvictionPolicy | str = "lru", device: str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
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
        self._segments: dict[SegmentKey, SegmentEntry] = {}
        self._pages: dict[PageKey, PageState] = {}
        self._pinned: set[SegmentKey] = set()
        # retained across a tool pause: kept in fast (capped), never evicted, until expiry
        self.retained = PinTable(int(config.retain_share * config.fast_bytes))
        self.clock = clock  # seconds, for retention expiry
        self._clock = itertools.count(1)
        self._seq = itertools.count()
        self._below = [[t.name for t in tiers[i + 1 :]] for i in range(len(tiers))]
        self._ledger = MissLedger()
        # the lowest tier when durable: segments are committed there and recovered from it
        self.durable: Tier | None = tiers[-1] if tiers[-1].durable else None

    # ---- reading ----

    def segment(self, key: SegmentKey) -> SegmentEntry | None:
        return self._segments.get(key)

    def segment_keys(self) -> list[SegmentKey]:
        return list(self._segments)

    def page(self, pk: PageKey) -> PageState:
        return self._pages[pk]

    def miss_reason(
        self, key: SegmentKey, cid: str, model_id: str, tokenizer_id: str
    ) -> MissReason:
        return self._ledger.reason(key, cid, model_id, tokenizer_id)

    def read_current(
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

    def make_room(self, level: int, need: int) -> None:
        """Free `need` bytes in tier `level` (spill, or evict segments at the lowest tier);
        raises NoRoom when it cannot."""
        tier = self.tiers[level]
        if tier.free_bytes >= need:
            return
        if level == len(self.tiers) - 1:
            self._evict_segments(tier, need)
            return
        self.tier_stats.spills += 1
        candidates = [self.info(pk, level) for pk in self._resident(level)]
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
                self.make_room(level + 1, sum(self._pages[k].nbytes for k in keys))
                keys = [k for k in keys if k in self._pages]  # eviction below may take some
                pages = [(k, p) for k in keys if (p := tier.view(k)) is not None]
                self.write_below(below, pages)
            except (NoRoom, TierError) as e:
                self.tier_stats.failed_spills += 1
                self._error(str(e) or f"no room in the {below.name} tier")
                break
            tier.drop(keys)
            for k in keys:
                del self._pages[k].stale[tier.name]
        if tier.free_bytes < need:
            raise NoRoom(f"{tier.name} tier is full")

    def write_below(self, below: Tier, pages: list[tuple[PageKey, PageData]]) -> None:
        if not pages:
            return
        deltas: dict[PageKey, list[int]] = {}
        durable = below is self.durable
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
                    deltas[k] = mask_slots(stale)
        below.write(pages, deltas, owned=True)  # views of the tier above, never changed
        self.tier_stats.written_pages += len(pages)
        self.mark_current([k for k, _ in pages], below.name)
        if durable:
            for seg_key in {self._pages[k].segment for k, _ in pages}:
                self.commit(seg_key, self._segments[seg_key])

    def commit(self, key: SegmentKey, seg: SegmentEntry) -> None:
        disk = self.durable
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
            if key in self._pinned or self.retained.is_pinned(key, self.clock()):
                # being served, or retained: skip it this round
                self.policy.on_remove(key)
                skipped.append(key)
                continue
            self.forget(key)
            self.stats.evictions += 1
        for key in skipped:
            self.policy.on_insert(key, 0)
        if tier.free_bytes < need:
            raise NoRoom(f"the {tier.name} tier cannot make room")

    def info(self, pk: PageKey, level: int) -> PageInfo:
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
        pages, now = self._pages, self.clock()
        held = self.tiers[level].page_keys()  # the pages with a copy there (a stale key)
        kept = self._pinned | {s for s in {pages[pk].segment for pk in held}
                               if self.retained.is_pinned(s, now)}  # fmt: skip
        return sorted(
            (pk for pk in held if level > 0 or pages[pk].segment not in kept),
            key=lambda pk: pages[pk].seq,
        )

    def missing_bytes(self, keys: Sequence[PageKey], tier: Tier) -> int:
        return sum(self._pages[k].nbytes for k in keys if k not in tier)

    @contextmanager
    def pin(self, key: SegmentKey) -> Iterator[None]:
        added = key not in self._pinned
        self._pinned.add(key)
        try:
            yield
        finally:
            if added:
                self._pinned.discard(key)

    def _error(self, message: str) -> None:
        self.tier_stats.errors = [*self.tier_stats.errors[-9:], message]

    # ---- pages and segments coming and going ----

    def add_segment(
        self, key: SegmentKey, seg: SegmentEntry, sizes: Sequence[tuple[int, int]], tier: str,
        used: bool,
    ) -> None:  # fmt: skip
        """Index a segment whose pages (`sizes`: tokens and bytes of each, in order) have a
        current copy in `tier` only; `used`: it is used now (a put), else not yet (recovered)."""
        last_use = next(self._clock) if used else 0
        for i, (pk, (num_tokens, page_bytes)) in enumerate(zip(seg.pages, sizes, strict=True)):
            self._pages[pk] = PageState(key, i, num_tokens, page_bytes, {tier: 0}, last_use,
                                        next(self._seq))  # fmt: skip
        nbytes = sum(n for _, n in sizes)
        self._segments[key] = seg
        self._ledger.stored(key, seg.cid, seg.model_id, seg.tokenizer_id)
        self.policy.on_insert(key, nbytes)
        self.stats.entries += 1
        self.stats.bytes += nbytes
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)

    def forget(self, key: SegmentKey) -> None:
        """Remove a segment from every tier (eviction, a corrupt page, clear); the ledger
        remembers it, so a lookup says it was stored once."""
        seg = self._segments.pop(key)
        self.retained.unpin([key])
        for tier in self.tiers:
            tier.drop(seg.pages)
        nbytes = sum(self._pages.pop(k).nbytes for k in seg.pages)
        if self.durable is not None:
            self.durable.drop_meta(f"seg:{key}")
        self.policy.on_remove(key)
        self.stats.entries -= 1
        self.stats.bytes -= nbytes
        self._ledger.evicted(key, seg.model_id, seg.tokenizer_id)

    def clear(self) -> None:
        """Forget every segment, and that any was stored (clear() is not an eviction)."""
        for key in list(self._segments):
            self.forget(key)
        self._ledger.clear()

    # ---- copies ----

    def mark_current(self, keys: Sequence[PageKey], tier: str) -> None:
        """The pages' copies just written to `tier` are current."""
        for k in keys:
            self._pages[k].stale[tier] = 0

    def mark_updated(self, changes: dict[PageKey, int]) -> None:
        """Pages given a newer version in the fast tier: page -> bit mask of the slots that
        changed; every lower copy becomes stale at those slots."""
        now = next(self._clock)
        for pk, changed in changes.items():
            state = self._pages[pk]
            for tier in list(state.stale):
                state.stale[tier] |= changed
            state.stale["fast"] = 0
            state.last_use = now
            self.tier_stats.updates += 1

    def touch(self, seg: SegmentEntry) -> None:
        """The segment's pages were used now (a lookup)."""
        now = next(self._clock)
        for pk in seg.pages:
            self._pages[pk].last_use = now

    def drop_above_lowest(self) -> None:
        """Drop every copy above the lowest tier of a page whose lowest copy is current."""
        lowest = self.tiers[-1].name
        for tier in self.tiers[:-1]:
            keys = [pk for pk, s in self._pages.items()
                    if tier.name in s.stale and s.stale.get(lowest) == 0]  # fmt: skip
            tier.drop(keys)
            for pk in keys:
                del self._pages[pk].stale[tier.name]
