"""Fast and host tiers: pages in memory (the attention pool's device, or host RAM)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from agentcache.tiers.base import PageData, PageKey, Tier


class MemoryTier(Tier):
    """Pages as tensors on `device`. `pin` uses page-locked host memory (GPU machines only),
    so copies to the device can run asynchronously. Stored tensors are never changed in
    place: a page is replaced by new tensors, so `view` can hand out the stored ones and
    `write(owned=True)` keep the caller's (no copy when they are already on `device`)."""

    def __init__(
        self, name: str, capacity_bytes: int, device: torch.device | str = "cpu", pin: bool = False
    ) -> None:
        super().__init__(capacity_bytes)
        self.name = name
        self.device = torch.device(device)
        self.pin = pin
        self._pages: dict[PageKey, PageData] = {}

    def write(
        self,
        pages: Sequence[tuple[PageKey, PageData]],
        deltas: Mapping[PageKey, Sequence[int]] | None = None,  # a copy in memory is whole
        owned: bool = False,
    ) -> None:
        held = sum(self._pages[k].nbytes for k, _ in pages if k in self._pages)
        self._check_room(pages, held)
        t0 = time.perf_counter()
        nbytes = 0
        for key, page in pages:
            # positions stay on their device and unpinned, as the copy below leaves them
            if (
                owned
                and self._keeps(page.keys)
                and self._keeps(page.values)
                and _owns_storage(page.positions)
            ):
                self._pages[key] = page
            else:
                self._pages[key] = PageData(
                    self._copy(page.keys), self._copy(page.values), page.positions.clone()
                )
            nbytes += page.nbytes
        self.counters.pages = len(self._pages)
        self.counters.write_s += time.perf_counter() - t0
        self._count_write(pages, nbytes - held, nbytes)

    def _keeps(self, t: torch.Tensor) -> bool:
        """Whether a given K or V tensor can be stored as it is: where `_copy` would put it
        (this device, pinned if the tier pins) and owning its whole storage."""
        return t.device == self.device and (not self.pin or t.is_pinned()) and _owns_storage(t)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device, pin_memory=self.pin)
        return out.copy_(t)

    def read(self, key: PageKey) -> PageData | None:
        return self._load(key, copy=True)

    def view(self, key: PageKey) -> PageData | None:
        return self._load(key, copy=False)

    def _load(self, key: PageKey, copy: bool) -> PageData | None:
        t0 = time.perf_counter()
        page = self._pages.get(key)
        if page is not None:
            self.counters.loads += 1
            if copy:
                page = PageData(page.keys.clone(), page.values.clone(), page.positions.clone())
        self.counters.read_s += time.perf_counter() - t0
        return page

    def drop(self, keys: Sequence[PageKey]) -> None:
        for key in keys:
            page = self._pages.pop(key, None)
            if page is not None:
                self.counters.bytes -= page.nbytes
        self.counters.pages = len(self._pages)

    def __contains__(self, key: object) -> bool:
        return key in self._pages

    def page_keys(self) -> list[PageKey]:
        return list(self._pages)


def _owns_storage(t: torch.Tensor) -> bool:
    """Contiguous and the whole of its storage: keeping it keeps nothing else alive (a slice
    of a larger tensor would keep all of it, and alias its owner)."""
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.nbytes
