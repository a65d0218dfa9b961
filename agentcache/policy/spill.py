"""Spill order for the tiered segment store: which pages leave a full tier, and how the
ones that must be written are grouped into write calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentcache.registry import Registry

SPILL_POLICIES: Registry[SpillPolicy] = Registry("spill policy")


@dataclass(frozen=True)
class PageInfo:
    """A page resident in the tier that must make room."""

    key: str
    segment: str
    index: int  # page index within its segment
    nbytes: int
    dirty_tokens: int  # tokens the freshest lower copy lacks (all of them when there is none)
    clean: bool  # an identical copy exists in a lower tier
    last_use: int  # store clock at the last lookup, put or update


@dataclass(frozen=True)
class SpillPlan:
    drops: tuple[str, ...]  # forgotten without a write
    extents: tuple[tuple[str, ...], ...]  # written to the tier below, one write call each

    @property
    def keys(self) -> list[str]:
        return list(self.drops) + [k for e in self.extents for k in e]


class SpillPolicy(ABC):
    """Chooses the pages a full tier gives up.

    Contract: `plan(pages, need_bytes)` only reads `pages` and returns victims among them,
    each at most once, whose bytes add up to at least `need_bytes` (all pages when they hold
    less). Only clean pages may be dropped; every other victim is in exactly one extent. A
    policy may also write a clean page (a rewrite). need_bytes <= 0 is always an empty plan.

    `deltas`: whether the store writes a dirty page whose disk copy is stale at only some
    token slots as a delta of those slots (SLIDE's dirty ranges) rather than whole; a policy
    that keeps no dirty bits cannot.
    """

    deltas: bool = False

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")

    @abstractmethod
    def plan(self, pages: Sequence[PageInfo], need_bytes: int) -> SpillPlan: ...


def _take(pages: Sequence[PageInfo], need: int) -> list[PageInfo]:
    out, freed = [], 0
    for p in pages:
        if freed >= need:
            break
        out.append(p)
        freed += p.nbytes
    return out


@SPILL_POLICIES.register("slide")
class SlidePolicy(SpillPolicy):
    """SLIDE: clean pages first (oldest first, dropped, no write), then dirty pages by dirty
    token count descending; the dirty victims are written sorted by (segment, page), cut into
    extents of at most `max_extent_pages`, so each extent is one sequential write. A dirty
    page with a stale disk copy is written as a delta of its stale slots (`deltas=False`:
    whole pages, an ablation)."""

    def __init__(self, max_extent_pages: int = 64, deltas: bool = True) -> None:
        if max_extent_pages < 1:
            raise ValueError("max_extent_pages must be >= 1")
        if not isinstance(deltas, bool):
            raise ValueError(f"deltas must be true or false, got {deltas!r}")
        self.max_extent_pages = max_extent_pages
        self.deltas = deltas

    def plan(self, pages: Sequence[PageInfo], need_bytes: int) -> SpillPlan:
        if need_bytes <= 0:
            return SpillPlan((), ())
        clean = sorted((p for p in pages if p.clean), key=lambda p: p.last_use)
        dirty = sorted(
            (p for p in pages if not p.clean), key=lambda p: (-p.dirty_tokens, p.last_use)
        )
        victims = _take(clean + dirty, need_bytes)
        drops = tuple(p.key for p in victims if p.clean)
        writes = sorted((p for p in victims if not p.clean), key=lambda p: (p.segment, p.index))
        n = self.max_extent_pages
        extents = tuple(tuple(p.key for p in writes[i : i + n]) for i in range(0, len(writes), n))
        return SpillPlan(drops, extents)


@SPILL_POLICIES.register("lru")
class LRUSpillPolicy(SpillPolicy):
    """Baseline: least recently used first, each victim written back on its own (one write
    call per page), with no dirty bits: a clean page is written again too, as a store that
    does not track which pages changed must do."""

    def plan(self, pages: Sequence[PageInfo], need_bytes: int) -> SpillPlan:
        if need_bytes <= 0:
            return SpillPlan((), ())
        victims = _take(sorted(pages, key=lambda p: p.last_use), need_bytes)
        return SpillPlan((), tuple((p.key,) for p in victims))


@SPILL_POLICIES.register("lru-clean")
class LRUCleanSpillPolicy(SpillPolicy):
    """Ablation between the two: LRU order and page-at-a-time writes, but clean pages are
    dropped without a write (dirty bits, no coalescing, no dirty-count order)."""

    def plan(self, pages: Sequence[PageInfo], need_bytes: int) -> SpillPlan:
        if need_bytes <= 0:
            return SpillPlan((), ())
        victims = _take(sorted(pages, key=lambda p: p.last_use), need_bytes)
        drops = tuple(p.key for p in victims if p.clean)
        return SpillPlan(drops, tuple((p.key,) for p in victims if not p.clean))
