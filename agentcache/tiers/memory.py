"""Fast and host tiers: pages in memory (the attention pool's device, or host RAM)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from agentcache.tiers.base import PageData, PageKey, Tier


class MemoryTier(Tier):
    """Pages as tensors on `device`. `pin` uses page-locked host memory (GPU machines only),
    so copies to the device can run asynchronously."""

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
    ) -> None:
        held = sum(self._pages[k].nbytes for k, _ in pages if k in self._pages)
        self._check_room(pages, held)
        t0 = time.perf_counter()
        nbytes = 0
        for key, page in pages:
            self._pages[key] = PageData(
                self._copy(page.keys), self._copy(page.values), page.positions.clone()
            )
            nbytes += page.nbytes
        self.counters.pages = len(self._pages)
        self.counters.write_s += time.perf_counter() - t0
        self._count_write(pages, nbytes - held, nbytes)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, device=self.device, pin_memory=self.pin)
        return out.copy_(t)

    def read(self, key: PageKey) -> PageData | None:
        t0 = time.perf_counter()
        page = self._pages.get(key)
        copy = None
        if page is not None:
            self.counters.loads += 1
            copy = PageData(page.keys.clone(), page.values.clone(), page.positions.clone())
        self.counters.read_s += time.perf_counter() - t0
        return copy

    def drop(self, keys: Sequence[PageKey]) -> None:
        for key in keys:
            page = self._pages.pop(key, None)
            if page is not None:
                self.counters.bytes -= page.nbytes
        self.counters.pages = len(self._pages)

    def __contains__(self, key: object) -> bool:
        return key in self._pages
