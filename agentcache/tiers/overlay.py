"""Load-write decoupling (SLIDE): cached KV lands layer by layer on a loader thread while the
prefill computes; recomputed tokens of loaded spans write to overlay pages instead of waiting.

    base slots    : [ cached KV of reused spans, written by the loader, layer 0, 1, ... ]
    overlay pages : recomputed / fused K/V of loaded tokens, per layer (mask `written`)
    reads         : gather(l) waits for layer l's load, then overlays the rows written at l
    finish        : waits for every layer, folds the overlay rows into their base slots and
                    hands the overlay pages to the sequence, so decode fills them first

`DirectKV` is the reference path: every load has landed in place before compute starts.
Both give identical K/V, logits and tokens (tests/tiers/test_decoupled.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.errors import OutOfPagesError
from agentcache.kv.pool import PageId, PagePool, SequenceKV
from agentcache.model.rope import LayerRotary


@dataclass(frozen=True)
class PendingLoad:
    """Cached K/V of one reused span, moved from `old` to `new` positions on load."""

    slots: Tensor  # (n,) base slots of the span
    keys: Tensor  # (L, n, Hkv, Dh) rotated at `old`
    values: Tensor  # (L, n, Hkv, Dh)
    old: Tensor  # (n,)
    new: Tensor  # (n,)
    # (L, n) bool: the rows each layer lands (a sliding-window layer only those a query
    # reads: reuse/windowed.py); None: every row on every layer
    rows: Tensor | None = None

    def layer_keys(self, rotary: LayerRotary, layer: int | None = None) -> Tensor:
        """Keys of `layer` (n, Hkv, Dh), or of every layer (L, n, Hkv, Dh), moved to `new` by
        each layer's own rotary (a NoPE layer's as they are)."""
        if torch.equal(self.old, self.new):
            return self.keys if layer is None else self.keys[layer]
        if layer is None:
            return rotary.rerotate(self.keys, self.old, self.new)
        return rotary.rerotate_layer(layer, self.keys[layer], self.old, self.new)

    def land(self, pool: PagePool, rotary: LayerRotary, layer: int) -> None:
        """Write `layer`'s rows (those it lands) into the pool, keys moved."""
        if self.rows is None or bool(self.rows[layer].all()):
            pool.keys[layer].index_copy_(0, self.slots, self.layer_keys(rotary, layer))
            pool.values[layer].index_copy_(0, self.slots, self.values[layer])
            return
        m = self.rows[layer]
        keys = self.keys[layer][m]
        if not torch.equal(self.old, self.new):
            keys = rotary.rerotate_layer(layer, keys, self.old[m], self.new[m])
        pool.keys[layer].index_copy_(0, self.slots[m], keys)
        pool.values[layer].index_copy_(0, self.slots[m], self.values[layer][m])


class DirectKV:
    """The selective prefill's view of the sequence's K/V, loads already in place."""

    def __init__(self, seq: SequenceKV) -> None:
        self.seq = seq
        self.slots = seq.slots()
        self.load_s = 0.0
        self.wait_s = 0.0
        self.fallbacks: list[str] = []

    @classmethod
    def landed(cls, seq: SequenceKV, loads: list[PendingLoad], rotary: LayerRotary) -> DirectKV:
        """Every load landed in place (re-rotated), timed in `load_s`."""
        t0 = time.perf_counter()
        for ld in loads:
            if ld.rows is None:  # every layer, all rows: one call
                seq.write_all(ld.slots, ld.layer_keys(rotary), ld.values)
                continue
            for layer in range(len(ld.rows)):
                ld.land(seq.pool, rotary, layer)
        kv = cls(seq)
        kv.load_s = time.perf_counter() - t0
        return kv

    def write(self, layer: int, idx: Tensor, k: Tensor, v: Tensor) -> None:
        self.seq.write(layer, self.slots[idx], k, v)

    def gather(self, layer: int) -> tuple[Tensor, Tensor]:
        return self.seq.gather(layer)

    def cached(self, layer: int, idx: Tensor) -> tuple[Tensor, Tensor]:
        """K/V of `idx` as loaded (before this layer's writes)."""
        pool, rows = self.seq.pool, self.slots[idx]
        return pool.keys[layer][rows], pool.values[layer][rows]

    def finish(self) -> float | None:
        """Everything landed; returns the load/compute overlap fraction (None: no overlap)."""
        return None


class OverlayKV(DirectKV):
    def __init__(
        self, seq: SequenceKV, loads: list[PendingLoad], rotary: LayerRotary, loaded: Tensor
    ) -> None:
        super().__init__(seq)
        pool = seq.pool
        self.loaded = loaded  # (T,) bool: tokens whose base slot the loader writes
        self.num_layers = pool.config.num_layers
        t = len(self.slots)
        self.overlay_slots = torch.full((t,), -1, dtype=torch.int64)
        self.written = torch.zeros((self.num_layers, t), dtype=torch.bool)
        self.pages: list[PageId] = []
        self._used = 0
        self._inplace = False
        self._ready = [threading.Event() for _ in range(self.num_layers)]
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, args=(loads, rotary), daemon=True)
        self._thread.start()

    def _load(self, loads: list[PendingLoad], rotary: LayerRotary) -> None:
        pool = self.seq.pool
        try:
            with torch.inference_mode():
                for layer in range(self.num_layers):
                    t0 = time.perf_counter()
                    for ld in loads:
                        ld.land(pool, rotary, layer)
                    self.load_s += time.perf_counter() - t0
                    self._ready[layer].set()
        except BaseException as e:  # surfaced on the compute thread at its next wait
            self._error = e
            for ev in self._ready:
                ev.set()

    def _wait(self, layer: int) -> None:
        if not self._ready[layer].is_set():
            t0 = time.perf_counter()
            self._ready[layer].wait()
            self.wait_s += time.perf_counter() - t0
        if self._error is not None:
            raise self._error

    def write(self, layer: int, idx: Tensor, k: Tensor, v: Tensor) -> None:
        over = self.loaded[idx]
        if self._inplace or not bool(over.any()):
            return super().write(layer, idx, k, v)
        if not self._reserve(idx[over]):
            return self.write(layer, idx, k, v)  # now in place
        if not bool(over.all()):
            super().write(layer, idx[~over], k[~over], v[~over])
        rows = idx[over]
        slots = self.overlay_slots[rows]
        self.seq.pool.keys[layer].index_copy_(0, slots, k[over])
        self.seq.pool.values[layer].index_copy_(0, slots, v[over])
        self.written[layer, rows] = True

    def _reserve(self, rows: Tensor) -> bool:
        """Overlay slots for `rows` that have none; False after falling back to in place."""
        new = rows[self.overlay_slots[rows] < 0]
        if len(new) == 0:
            return True
        size = self.seq.pool.config.page_size
        need = -(-(self._used + len(new)) // size) - len(self.pages)
        if need > 0:
            try:
                self.pages += self.seq.pool.allocate(need)
            except OutOfPagesError:
                self.fallbacks.append("no free pages for overlay: waited for the load")
                self._land()
                self._inplace = True
                return False
        pos = torch.arange(self._used, self._used + len(new))
        pages = torch.tensor(self.pages, dtype=torch.int64)
        self.overlay_slots[new] = pages[pos // size] * size + pos % size
        self._used += len(new)
        return True

    def gather(self, layer: int) -> tuple[Tensor, Tensor]:
        self._wait(layer)
        keys, values = self.seq.gather(layer)
        rows = self.written[layer].nonzero().flatten()
        if len(rows):
            slots = self.overlay_slots[rows]
            keys[rows] = self.seq.pool.keys[layer][slots]
            values[rows] = self.seq.pool.values[layer][slots]
        return keys, values

    def cached(self, layer: int, idx: Tensor) -> tuple[Tensor, Tensor]:
        self._wait(layer)
        return super().cached(layer, idx)

    def _land(self) -> None:
        """Wait for every layer, then fold overlay rows into their base slots."""
        for layer in range(self.num_layers):
            self._wait(layer)
        self._thread.join()
        pool = self.seq.pool
        for layer in range(self.num_layers):
            rows = self.written[layer].nonzero().flatten()
            if len(rows):
                src, dst = self.overlay_slots[rows], self.slots[rows]
                pool.keys[layer].index_copy_(0, dst, pool.keys[layer][src])
                pool.values[layer].index_copy_(0, dst, pool.values[layer][src])
        self.written.zero_()

    def finish(self) -> float | None:
        self._land()
        # the overlay pages become the sequence's next pages: decode fills them first
        self.seq.table.pages.extend(self.pages)
        self.pages = []
        if self.load_s <= 0:
            return None
        return max(0.0, 1.0 - self.wait_s / self.load_s)
