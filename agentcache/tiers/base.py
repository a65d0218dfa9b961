"""The tier seam: fast, host and disk page storage behind one small interface.

A tier stores pages: the K/V of at most one page-size run of a segment's tokens, for every
layer, with the positions its keys are rotated at. Tiers are mechanism only: they store, read,
drop and count. Which pages live where, and what gets written when, is the store's business
(agentcache/tiers/store.py) and the spill policy's (agentcache/policy/spill.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

import torch
from torch import Tensor

from agentcache.errors import AgentCacheError

PageKey = NewType("PageKey", str)


class TierError(AgentCacheError):
    """A tier could not store a page (disk full, folder not writable)."""


class TierCapacityError(AgentCacheError):
    """Tier capacities that cannot hold one request's working set."""


@dataclass(frozen=True)
class PageData:
    """One page of one segment: K/V of n <= page_size tokens for every layer."""

    keys: Tensor  # (L, n, Hkv, Dh)
    values: Tensor  # (L, n, Hkv, Dh)
    positions: Tensor  # (n,) int64

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def take(self, slots: Sequence[int]) -> PageData:
        """A new page of just these token slots, in this order."""
        idx = torch.tensor(list(slots), dtype=torch.long)
        return PageData(*(t.index_select(dim, idx.to(t.device)) for t, dim in self._parts()))

    def place(self, slots: Sequence[int], src: PageData) -> None:
        """Overwrite these token slots in place with `src`'s tokens, in order (any device)."""
        idx = torch.tensor(list(slots), dtype=torch.long)
        for (t, dim), (s, _) in zip(self._parts(), src._parts(), strict=True):
            t.index_copy_(dim, idx.to(t.device), s.to(t.device, t.dtype))

    def _parts(self) -> tuple[tuple[Tensor, int], ...]:
        return (self.keys, 1), (self.values, 1), (self.positions, 0)


@dataclass
class TierCounters:
    """Per-tier counters. bytes/pages: held now; hits: pages a lookup served from this tier;
    loads: pages read out of it; read_s: the seconds spent in reads (a miss or a corrupt page
    too); writes/write_calls/write_s: pages written into it, the calls that wrote them and the
    seconds spent in them; bytes_written includes per-call headers;
    corrupt: reads that failed their checksum or found the page file missing; failed_writes:
    write calls that raised; delta_writes: pages of `writes` stored as deltas (only their
    changed token slots, on top of the copy the tier held)."""

    bytes: int = 0
    pages: int = 0
    peak_bytes: int = 0
    hits: int = 0
    loads: int = 0
    writes: int = 0
    write_calls: int = 0
    bytes_written: int = 0
    corrupt: int = 0
    failed_writes: int = 0
    write_s: float = 0.0  # wall time spent inside write calls
    read_s: float = 0.0  # wall time spent inside reads
    delta_writes: int = 0


class Tier(ABC):
    """Byte-bounded page storage.

    Contract:
    - `write(pages)` stores every page of the sequence in ONE write call (one extent); a page
      already present is replaced. It never evicts: the caller makes room first, and a write
      that would exceed `capacity_bytes` raises ValueError. On an I/O failure it raises
      TierError and stores none of the pages; counters count the failed call.
    - `write(pages, deltas)`: for a key in `deltas`, the caller promises that the tier's copy
      of that page differs from the new one only at the token slots `deltas[key]` names; the
      tier may store just those slots (a delta) instead of the whole page. A read returns the
      whole new page either way. Tiers where a copy costs nothing extra ignore `deltas`.
    - `read(key)` returns the page or None when it is absent, missing or fails its checksum
      (counted in `counters.corrupt`); it never raises for bad data. The returned tensors are
      the caller's: a tier keeps no alias to them, nor to tensors it was given by `write`.
    - `view(key)` is `read` without the copy where a tier can skip it: the tensors may be the
      tier's own, so the caller must not change them. A tier never changes a stored tensor in
      place, so a view stays valid (and unchanged) after the page is replaced or dropped.
    - `write(pages, owned=True)`: the caller gives the pages' tensors away (nothing will
      change them; they may be another tier's view), and a tier may keep them as they are
      instead of copying them.
    - `drop(keys)` forgets pages (absent keys are ignored); dropping never writes page data.
    - `close()` releases what the tier holds outside the process (open files, a folder's
      lock); the tier is not used after it. Closing twice is harmless.
    - Counters move only through these calls.
    - `durable`: a durable tier's pages outlive the process (a tier opened on the same place
      finds them), and it keeps named records (`meta`, `put_meta`, `drop_meta`) that outlive
      it too; a store commits what it needs to find its pages again there, and writes to a
      durable tier count as persisting. A tier that is not durable holds no records:
      `meta` is empty and `put_meta` raises TypeError.
    """

    name: str
    durable: bool = False

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"{type(self).__name__}: capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.counters = TierCounters()

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.counters.bytes

    @abstractmethod
    def write(
        self,
        pages: Sequence[tuple[PageKey, PageData]],
        deltas: Mapping[PageKey, Sequence[int]] | None = None,
        owned: bool = False,
    ) -> None: ...

    @abstractmethod
    def read(self, key: PageKey) -> PageData | None: ...

    def view(self, key: PageKey) -> PageData | None:
        """`read`, read-only: the tier's own tensors where it holds them in memory."""
        return self.read(key)

    @abstractmethod
    def drop(self, keys: Sequence[PageKey]) -> None: ...

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def page_keys(self) -> list[PageKey]:
        """The keys of the pages the tier holds."""

    def close(self) -> None:
        return None

    @property
    def meta(self) -> Mapping[str, Any]:
        """The named records the tier keeps (durable tiers only)."""
        return {}

    def put_meta(self, name: str, value: Any) -> None:
        raise TypeError(f"the {self.name} tier is not durable: it keeps no records")

    def drop_meta(self, name: str) -> None:
        """Forget a record (an absent name is ignored)."""
        return None

    def page_size_of(self, key: PageKey) -> tuple[int, int]:
        """(tokens, K/V bytes) of a stored page, without reading it."""
        page = self.view(key)
        if page is None:
            raise KeyError(key)
        return page.num_tokens, page.nbytes

    def _check_room(self, pages: Sequence[tuple[PageKey, PageData]], held: int) -> None:
        """`held`: bytes of the pages being replaced."""
        need = sum(p.nbytes for _, p in pages) - held
        if self.counters.bytes + need > self.capacity_bytes:
            raise ValueError(
                f"{self.name} tier: writing {need} bytes exceeds its capacity "
                f"({self.counters.bytes} of {self.capacity_bytes} used); make room first"
            )

    def _count_write(
        self, pages: Sequence[tuple[PageKey, PageData]], added: int, nbytes: int
    ) -> None:
        c = self.counters
        c.writes += len(pages)
        c.write_calls += 1
        c.bytes_written += nbytes
        c.bytes += added
        c.peak_bytes = max(c.peak_bytes, c.bytes)
