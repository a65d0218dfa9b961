"""Paged KV memory: a page pool with refcounts and a free list, and per-sequence block tables.

Mechanism only: allocation, refcounts and slot arithmetic. Who evicts what is policy elsewhere.

    pool.keys[layer] : (num_pages * page_size, Hkv, Dh)   slot = page * page_size + offset
                       (a view: stored head-major, so a head's run of slots is contiguous)
    BlockTable       : [page_0, page_1, ...] + num_tokens; token i lives in slot
                       pages[i // page_size] * page_size + i % page_size
    SequenceKV.spans : maximal runs [start, end) of consecutive slots holding the sequence,
                       by slot: pages 7, 8, 3 with 40 tokens -> [(48, 56), (112, 144)]
                       (page 3 holds tokens 32..39, pages 7-8 tokens 0..31)

Memory: the pool's storage is reserved, not filled, at construction (an anonymous private
mapping on the CPU, which the OS backs page by page on first write) and pages are handed
out lowest id first, never-used ids last, so the memory it holds is that of the most pages
ever in use at once (`touched_pages`), not `num_pages`. The storage never moves: a view of
`keys`/`values` stays valid across `allocate`. A pool is sized by pages or by bytes
(`PoolConfig.from_bytes`); a freed page keeps its memory for the next sequence.
"""

from __future__ import annotations

import bisect
import itertools
import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NewType

import torch
from torch import Tensor

from agentcache.errors import OutOfPagesError

PageId = NewType("PageId", int)


@dataclass(frozen=True)
class PoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_pages: int
    page_size: int = 16
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.num_pages < 1 or self.page_size < 1:
            raise ValueError("num_pages and page_size must be >= 1")

    @property
    def page_bytes(self) -> int:
        """Bytes of K and V of one page across all layers."""
        item = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * item

    @property
    def pool_bytes(self) -> int:
        """The most bytes the pool's K and V can hold (all `num_pages` in use)."""
        return self.num_pages * self.page_bytes

    @classmethod
    def from_bytes(
        cls, num_layers: int, num_kv_heads: int, head_dim: int, kv_bytes: int,
        page_size: int = 16, dtype: torch.dtype = torch.float32,
    ) -> PoolConfig:  # fmt: skip
        """The pool of as many whole pages as `kv_bytes` holds; ValueError when not one."""
        one = cls(num_layers, num_kv_heads, head_dim, 1, page_size, dtype)
        if kv_bytes < one.page_bytes:
            raise ValueError(
                f"kv_bytes={kv_bytes} holds no KV page: one page of {page_size} tokens is "
                f"{one.page_bytes} bytes for this model ({num_layers} layers, {num_kv_heads} "
                f"KV heads of {head_dim}, {str(dtype).removeprefix('torch.')})"
            )
        return cls(num_layers, num_kv_heads, head_dim, kv_bytes // one.page_bytes, page_size,
                   dtype)  # fmt: skip


def _reserve(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A zero tensor of `shape` whose memory the OS provides on first write: an anonymous
    private mapping (zero-filled by the OS, resident only where written)."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    # no swap reserved up front either (a strict-overcommit host would refuse a large pool)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    buffer = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)


class PagePool:
    """Fixed-capacity page memory. `allocate` raises `OutOfPagesError` rather than evicting."""

    # (the free pages are `_free`, ids once used and released, plus the never-used ids
    # `_fresh..num_pages-1`, taken in order so the touched storage stays a prefix)

    def __init__(self, config: PoolConfig) -> None:
        c = config
        self.config = config
        # stored head-major, (L, Hkv, slots, Dh): a head's keys over a run of slots are one
        # contiguous block, which decode attention reads in place; `keys` and `values` are
        # (L, slots, Hkv, Dh) views of that storage, the layout every reader indexes
        shape = (c.num_layers, c.num_kv_heads, c.num_pages * c.page_size, c.head_dim)
        self.keys = _reserve(shape, c.dtype).transpose(1, 2)
        self.values = _reserve(shape, c.dtype).transpose(1, 2)
        self._free: list[PageId] = []
        self._fresh = 0
        self._refcount = [0] * c.num_pages
        self.peak_pages_used = 0
        self.num_shared = 0  # pages more than one sequence holds now (kv/shared.py)
        # called with each page whose last reference is released (`SharedPages` forgets it)
        self.on_free: Callable[[PageId], None] | None = None

    @property
    def num_free(self) -> int:
        return len(self._free) + self.config.num_pages - self._fresh

    @property
    def num_used(self) -> int:
        return self._fresh - len(self._free)

    @property
    def touched_pages(self) -> int:
        """Pages whose memory the pool has written or may have: the most ever in use."""
        return self._fresh

    @property
    def resident_bytes(self) -> int:
        """K/V bytes the pool holds in memory now (an upper bound: `touched_pages`)."""
        return self._fresh * self.config.page_bytes

    def _take_free(self) -> PageId:
        if self._free:
            return self._free.pop()
        self._fresh += 1
        return PageId(self._fresh - 1)

    def refcount(self, page: PageId) -> int:
        return self._refcount[page]

    def allocate(self, n: int) -> list[PageId]:
        if n > self.num_free:
            c = self.config
            raise OutOfPagesError(
                f"need {n} KV pages ({n * c.page_bytes} bytes), only {self.num_free} of "
                f"{c.num_pages} are free (the pool holds {c.pool_bytes} bytes); raise the "
                "fast-tier capacity (kv_bytes or kv_pages) or shorten the prompt"
            )
        pages = [self._take_free() for _ in range(n)]
        for p in pages:
            self._refcount[p] = 1
        self.peak_pages_used = max(self.peak_pages_used, self.num_used)
        return pages

    def allocate_run(self, n: int) -> list[PageId]:
        """`n` pages, consecutive ids where the free pages hold such a run (the lowest one),
        so a sequence on them is one run of slots; otherwise any `n`, as `allocate`."""
        fresh = range(self._fresh, min(self.config.num_pages, self._fresh + max(n, 0)))
        free = sorted(self._free) + [PageId(i) for i in fresh]
        start = next((i for i in range(len(free) - n + 1) if free[i + n - 1] - free[i] == n - 1),
                     None)  # fmt: skip
        if n < 1 or start is None:
            return self.allocate(n) if n > 0 else []
        pages = free[start : start + n]
        taken = set(pages)
        self._free = [p for p in self._free if p not in taken]
        self._fresh = max(self._fresh, pages[-1] + 1)
        for p in pages:
            self._refcount[p] = 1
        self.peak_pages_used = max(self.peak_pages_used, self.num_used)
        return pages

    def incref(self, page: PageId) -> None:
        if self._refcount[page] <= 0:
            raise ValueError(f"page {page} is free")
        self._refcount[page] += 1
        if self._refcount[page] == 2:
            self.num_shared += 1

    def release(self, pages: list[PageId]) -> None:
        """Drop one reference to each page; a page reaching zero returns to the free list."""
        for p in pages:
            if self._refcount[p] <= 0:
                raise ValueError(f"page {p} released twice")
            self._refcount[p] -= 1
            if self._refcount[p] == 1:
                self.num_shared -= 1
            elif self._refcount[p] == 0:
                self._free.append(p)
                if self.on_free is not None:
                    self.on_free(p)


def slot_runs(slots: Tensor) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of consecutive values in `slots`, in the order given:
    [7, 8, 3] -> [(7, 9), (3, 4)]."""
    cuts = [0, *((torch.diff(slots) != 1).nonzero().flatten() + 1).tolist(), len(slots)]
    return [(int(slots[a]), int(slots[b - 1]) + 1) for a, b in itertools.pairwise(cuts) if b > a]


@dataclass
class BlockTable:
    """The pages of one sequence, in token order."""

    page_size: int
    pages: list[PageId] = field(default_factory=list)
    num_tokens: int = 0

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size) - len(self.pages)

    def slots(self, start: int = 0, end: int | None = None) -> Tensor:
        """Pool slot indices of tokens [start, end) as an int64 tensor."""
        end = self.num_tokens if end is None else end
        idx = torch.arange(start, end)
        pages = torch.tensor(self.pages, dtype=torch.int64)
        return pages[idx // self.page_size] * self.page_size + idx % self.page_size


class SequenceKV:
    """One sequence's KV in the pool: append tokens, write and gather per layer."""

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.table = BlockTable(pool.config.page_size)
        self._slots = torch.empty(0, dtype=torch.int64)
        self._spans: list[tuple[int, int]] = []
        # (T,) bool: tokens some layer holds no K/V for (a sliding-window layer's reused KV
        # no query reads, not loaded: reuse/windowed.py); nothing stores them. None: none
        self.holes: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.table.num_tokens

    def reserve(self, pages: int) -> None:
        """Take up to `pages` pages now (as one run of slots where the pool has one), for the
        tokens `extend` adds later; whatever the pool cannot give now is taken on demand."""
        n = min(pages - len(self.table.pages), self.pool.num_free)
        if n > 0:
            self.table.pages.extend(self.pool.allocate_run(n))

    def extend(self, n: int) -> Tensor:
        """Reserve n more tokens; returns their slots."""
        need = self.table.pages_needed(self.table.num_tokens + n)
        if need > 0:
            self.table.pages.extend(self.pool.allocate(need))
        start = self.table.num_tokens
        self.table.num_tokens += n
        new = self.table.slots(start)
        self._slots = torch.cat([self._slots, new])
        for a, b in slot_runs(new):
            self._add_span(a, b)
        return new

    def share_pages(self, pages: list[tuple[int, PageId]]) -> None:
        """Hold each `page` (a page of the pool another sequence holds, with the same K/V) as
        this sequence's page `index`, a full page, and give back the one it held there: the
        tokens' slots move to `page`. Nothing may write either page afterwards."""
        size = self.table.page_size
        for index, _ in pages:
            if (index + 1) * size > self.table.num_tokens:
                raise ValueError(f"page {index} of the sequence is not full")
        moved = False
        for index, page in pages:
            own = self.table.pages[index]
            if own == page:
                continue
            self.pool.incref(page)
            self.table.pages[index] = page
            self.pool.release([own])
            self._slots[index * size : (index + 1) * size] = torch.arange(
                page * size, (page + 1) * size
            )
            moved = True
        if moved:  # the runs of slots, from scratch
            self._spans = slot_runs(torch.sort(self._slots).values)

    def _add_span(self, start: int, end: int) -> None:
        """Insert slots [start, end), merging with the spans it touches."""
        spans = self._spans
        i = bisect.bisect_left(spans, (start, end))
        left = i > 0 and spans[i - 1][1] == start
        right = i < len(spans) and spans[i][0] == end
        if left and right:
            spans[i - 1 : i + 1] = [(spans[i - 1][0], spans[i][1])]
        elif left:
            spans[i - 1] = (spans[i - 1][0], end)
        elif right:
            spans[i] = (start, spans[i][1])
        else:
            spans.insert(i, (start, end))

    def slots(self) -> Tensor:
        return self._slots

    def spans(self) -> list[tuple[int, int]]:
        """The sequence's slots as maximal runs [start, end) of consecutive slots, in slot
        order (not token order): each token's slot lies in exactly one run. Readers of the
        whole context take `pool.keys[layer][start:end]` views, no copy."""
        return list(self._spans)

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        self.pool.keys[layer].index_copy_(0, slots, k)
        self.pool.values[layer].index_copy_(0, slots, v)

    def write_all(self, slots: Tensor, keys: Tensor, values: Tensor) -> None:
        """Write (L, n, Hkv, Dh) K/V of every layer into `slots` (n,)."""
        self.pool.keys[:, slots] = keys
        self.pool.values[:, slots] = values

    def gather_all(self, span: slice) -> tuple[Tensor, Tensor]:
        """K/V of every layer for tokens in `span`: two (L, n, Hkv, Dh) copies."""
        slots = self._slots[span]
        return self.pool.keys[:, slots], self.pool.values[:, slots]

    def read_all(self, span: slice) -> tuple[Tensor, Tensor]:
        """`gather_all`'s K/V, as views of the pool where the tokens' slots are one run in token
        order (no copy: valid while nothing writes those slots), else `gather_all`'s copies."""
        slots = self._slots[span]
        n = len(slots)
        if n and bool((slots.diff() == 1).all()):
            a = int(slots[0])
            return self.pool.keys[:, a : a + n], self.pool.values[:, a : a + n]
        return self.gather_all(span)

    def gather(self, layer: int, end: int | None = None) -> tuple[Tensor, Tensor]:
        """K/V of tokens [0, end) at `layer`: two (end, Hkv, Dh) tensors (copies)."""
        slots = self._slots if end is None else self._slots[:end]
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        return keys.index_select(0, slots), values.index_select(0, slots)  # keys[slots], faster

    def free(self) -> None:
        self.pool.release(self.table.pages)
        self.table = BlockTable(self.pool.config.page_size)
        self._slots = torch.empty(0, dtype=torch.int64)
        self._spans = []
        self.holes = None
