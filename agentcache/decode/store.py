"""Per-head paged KV for decode: a fast-tier arena of head-pages, a host-tier copy for offloaded
heads, and a per-head block table. Mechanism only: which pages are wanted is decided elsewhere.

    arena_k / arena_v : (1 + sum(capacity), page_size, Dh)   row 0 is the null page (zeros)
    table             : (L, Hkv, max_pages) int64, arena row of (layer, head, logical page);
                        0 (the null page) where the page is not resident
    table_fast        : the copy attention reads; `sync` copies only dirty (layer, head) rows
    host_k / host_v   : (n_offloaded, max_pages, page_size, Dh), full KV of offloaded heads
    slot_page         : (n_offloaded, max_capacity), logical page held in each slot, -1 free,
                        -2 beyond that head's capacity

Resident heads own `max_pages` slots, slot p = logical page p. Offloaded heads own `capacity`
slots; `place` evicts pages no longer wanted, promotes wanted pages from the host copy into the
freed slots (evicted slots are reused), and leaves everything else where it is.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.errors import OutOfPagesError

NULL_PAGE = 0


class HeadPagedKV:
    def __init__(
        self, head_dim: int, page_size: int, max_pages: int, capacity: Tensor, offload: Tensor
    ) -> None:
        """`capacity` (L, Hkv) slots per head; `offload` (L, Hkv) heads with a host copy."""
        n_layers, hkv = capacity.shape
        self.page_size, self.max_pages = page_size, max_pages
        self.offload = offload.clone()
        cap = torch.where(offload, capacity, torch.full_like(capacity, max_pages))
        self.capacity = cap
        self.region = 1 + torch.cumsum(cap.flatten(), 0).view(n_layers, hkv) - cap  # first row
        rows = 1 + int(cap.sum())
        self.arena_k = torch.zeros(rows, page_size, head_dim)
        self.arena_v = torch.zeros(rows, page_size, head_dim)
        self.table = torch.zeros(n_layers, hkv, max_pages, dtype=torch.int64)
        self.table_fast = self.table.clone()
        self.dirty = torch.zeros(n_layers, hkv, dtype=torch.bool)
        self.rows_synced = 0
        self.off_row = torch.full((n_layers, hkv), -1, dtype=torch.int64)
        n_off = int(offload.sum())
        self.off_row[offload] = torch.arange(n_off)
        self.host_k = torch.zeros(n_off, max_pages, page_size, head_dim)
        self.host_v = torch.zeros(n_off, max_pages, page_size, head_dim)
        width = int(cap[offload].max()) if n_off else 0
        self.slot_page = torch.full((n_off, width), -1, dtype=torch.int64)
        if n_off:
            beyond = torch.arange(width)[None, :] >= cap[offload][:, None]
            self.slot_page[beyond] = -2
        # per layer: resident heads and offloaded heads (with their host rows)
        self.resident_heads = [torch.nonzero(~offload[i]).flatten() for i in range(n_layers)]
        self.offloaded_heads = [torch.nonzero(offload[i]).flatten() for i in range(n_layers)]
        self.num_tokens = 0

    @property
    def fast_tier_bytes(self) -> int:
        """KV bytes of the arena, null page excluded."""
        return (self.arena_k[1:].nbytes + self.arena_v[1:].nbytes) if len(self.arena_k) else 0

    @property
    def host_tier_bytes(self) -> int:
        return self.host_k.nbytes + self.host_v.nbytes

    @property
    def page_bytes(self) -> int:
        """K and V bytes of one head-page."""
        return self.arena_k[0].nbytes * 2

    def load(self, keys: Tensor, values: Tensor) -> None:
        """Take a prefilled sequence, keys/values (L, T, Hkv, Dh): every page of resident heads
        into the arena, every page of offloaded heads into the host copy (nothing resident).
        Each (layer, head)'s tokens are copied straight into its consecutive rows, the views
        `full_kv` reads (a resident head's arena region, an offloaded head's host copy): one
        copy of the KV, no padded or permuted intermediate; the last page's rows past T stay
        zero."""
        n_layers, t, hkv, _ = keys.shape
        pages = -(-t // self.page_size)
        self.num_tokens = t
        for layer in range(n_layers):
            for head in range(hkv):
                dk, dv = self.full_kv(layer, head)
                dk.copy_(keys[layer, :, head])
                dv.copy_(values[layer, :, head])
        res = ~self.offload
        self.table[res, :pages] = self.region[res][:, None] + torch.arange(pages)
        self.dirty[:] = True

    def append_token(self) -> int:
        """Reserve the next token; opens a page (a slot for every head) at a page boundary.
        Returns the token's index."""
        t = self.num_tokens
        p = t // self.page_size
        if p >= self.max_pages:
            raise OutOfPagesError(f"decode KV holds {self.max_pages} pages; token {t} does not fit")
        if t % self.page_size == 0:
            self._open_page(p)
        self.num_tokens = t + 1
        return t

    def _open_page(self, p: int) -> None:
        res = ~self.offload
        self.table[:, :, p][res] = self.region[res] + p
        if len(self.slot_page):
            free = self.slot_page == -1
            if not bool(free.any(1).all()):
                raise OutOfPagesError("an offloaded head has no free fast-tier slot for a new page")
            slot = free.to(torch.int8).argmax(1)  # first free slot per offloaded head
            self.slot_page[torch.arange(len(slot)), slot] = p
            self.table[:, :, p][self.offload] = self.region[self.offload] + slot
        self.dirty[:] = True

    def write(self, layer: int, token: int, k: Tensor, v: Tensor) -> None:
        """K/V (Hkv, Dh) of `token` at `layer`: into its resident page and the host copy."""
        p, o = divmod(token, self.page_size)
        rows = self.table[layer, :, p]
        self.arena_k[rows, o] = k
        self.arena_v[rows, o] = v
        off = self.offloaded_heads[layer]
        if len(off):
            host = self.off_row[layer, off]
            self.host_k[host, p, o] = k[off]
            self.host_v[host, p, o] = v[off]

    def write_tokens(self, layer: int, start: int, k: Tensor, v: Tensor) -> None:
        """K/V (n, Hkv, Dh) of the n tokens from `start` at `layer`: `write` of each, in one
        indexed copy per tier and tensor."""
        t = torch.arange(start, start + k.shape[0])
        p, o = t // self.page_size, t % self.page_size
        rows = self.table[layer][:, p]  # (Hkv, n)
        self.arena_k[rows, o] = k.transpose(0, 1)
        self.arena_v[rows, o] = v.transpose(0, 1)
        off = self.offloaded_heads[layer]
        if len(off):
            host = self.off_row[layer, off][:, None]
            self.host_k[host, p, o] = k[:, off].transpose(0, 1)
            self.host_v[host, p, o] = v[:, off].transpose(0, 1)

    def full_kv(self, layer: int, head: int) -> tuple[Tensor, Tensor]:
        """Every token's K/V of (layer, head), two (num_tokens, Dh) views, no copy: a resident
        head's pages are consecutive arena rows, an offloaded head's full KV is its host copy."""
        n = self.num_tokens
        if bool(self.offload[layer, head]):
            r = int(self.off_row[layer, head])
            k, v = self.host_k[r], self.host_v[r]
        else:
            first = int(self.region[layer, head])
            k = self.arena_k[first : first + self.max_pages]
            v = self.arena_v[first : first + self.max_pages]
        return k.flatten(0, 1)[:n], v.flatten(0, 1)[:n]

    def truncate(self, num_tokens: int) -> None:
        """Forget every token from `num_tokens` on; pages left empty are closed (their slots of
        offloaded heads freed, their table entries pointed at the null page)."""
        if num_tokens > self.num_tokens:
            raise ValueError(f"cannot truncate {self.num_tokens} tokens to {num_tokens}")
        keep = -(-num_tokens // self.page_size)
        opened = -(-self.num_tokens // self.page_size)
        if opened > keep:
            self.table[:, :, keep:opened] = NULL_PAGE
            if len(self.slot_page):
                self.slot_page[self.slot_page >= keep] = -1
            self.dirty[:] = True
        self.num_tokens = num_tokens

    def sync(self, layer: int) -> None:
        """Copy the dirty rows of `layer` into the table attention reads."""
        rows = torch.nonzero(self.dirty[layer]).flatten()
        if len(rows):
            self.table_fast[layer, rows] = self.table[layer, rows]
            self.dirty[layer, rows] = False
            self.rows_synced += len(rows)

    def gather(self, layer: int, pages: Tensor) -> tuple[Tensor, Tensor]:
        """K/V of logical `pages` (Hkv, n), -1 = padding (null page): two (Hkv, n*page, Dh)."""
        rows = self.table_fast[layer].gather(1, pages.clamp(min=0))
        rows = rows.masked_fill(pages < 0, NULL_PAGE)
        hkv, n = rows.shape
        flat = rows.flatten()
        k = self.arena_k.flatten(1).index_select(0, flat).view(hkv, n * self.page_size, -1)
        v = self.arena_v.flatten(1).index_select(0, flat).view(hkv, n * self.page_size, -1)
        return k, v

    def place(self, layer: int, heads: Tensor, wanted: Tensor) -> int:
        """Make exactly `wanted` (m, R) logical pages (-1 padding) resident for offloaded
        `heads` (m,) of `layer`. Returns the number of head-pages promoted (copied in)."""
        host = self.off_row[layer, heads]
        sp = self.slot_page[host]  # (m, C)
        valid = wanted >= 0
        keep = ((sp[:, :, None] == wanted[:, None, :]) & valid[:, None, :]).any(-1)
        evict = (sp >= 0) & ~keep
        ei, ec = torch.nonzero(evict, as_tuple=True)
        self.table[layer, heads[ei], sp[ei, ec]] = NULL_PAGE
        sp[evict] = -1
        have = (wanted[:, :, None] == sp[:, None, :]).any(-1)
        promote = valid & ~have
        free = sp == -1
        if bool((promote.sum(1) > free.sum(1)).any()):
            raise OutOfPagesError("more pages wanted than an offloaded head's fast-tier slots")
        order = torch.argsort((~free).to(torch.int8), dim=1, stable=True)  # free slots first
        rank = torch.cumsum(promote, 1) - 1
        pi, pk = torch.nonzero(promote, as_tuple=True)
        slot = order[pi, rank[pi, pk]]
        page = wanted[pi, pk]
        sp[pi, slot] = page
        rows = self.region[layer, heads[pi]] + slot
        self.table[layer, heads[pi], page] = rows
        self.arena_k[rows] = self.host_k[host[pi], page]
        self.arena_v[rows] = self.host_v[host[pi], page]
        self.slot_page[host] = sp
        changed = torch.unique(torch.cat([heads[ei], heads[pi]]))
        self.dirty[layer, changed] = True
        return len(pi)

    def resident_pages(self, layer: int, head: int) -> list[int]:
        """Logical pages of (layer, head) resident in the fast tier, ascending."""
        return torch.nonzero(self.table[layer, head] != NULL_PAGE).flatten().tolist()
