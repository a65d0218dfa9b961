"""Pages held in common: running sequences whose prompts open with the same tokens hold one
copy of those tokens' K/V.

    turn A (running) : [p3][p4][p5][p6 ...]      pages 3-5 registered under their block chain
    turn B (prefill) : [p9][p10][p11][p12 ...]   same first 48 tokens, the same K/V bits
    after `share(B)` : [p3][p4][p5][p12 ...]     pages 9-11 given back to the pool

A page is known by its block's chain id (`reuse.prefix.block_chain`: every token before it,
from the root of its scope), so pages of different tenants or cache salts are never
candidates. A candidate is taken only when its K/V equals the sequence's own, bit for bit, over
every layer: a sequence holds the same K/V either way, and its output is what it is alone. So
sharing needs no rule about how either sequence came by its K/V (computed, loaded exactly,
re-rotated): where they differ, each keeps its own.

Only a sequence's full prompt pages take part, after its prefill: nothing writes a full page
of a prompt afterwards (new tokens go after it), so a registered page holds its K/V until its
last holder lets it go, when the pool forgets it here (`PagePool.on_free`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentcache.kv.pool import PageId, PagePool, SequenceKV


class SharedPages:
    """The full prompt pages of running sequences, by chain id, for the next sequence to share.

    Not thread-safe: the caller holds the lock its pool's other users hold."""

    def __init__(self, pool: PagePool) -> None:
        if pool.on_free is not None:
            raise ValueError("the pool already has an on_free hook")
        self.pool = pool
        self._page: dict[str, PageId] = {}  # chain id -> the page registered under it
        self._key: dict[PageId, str] = {}  # and back
        pool.on_free = self._forget
        self.shared = 0  # pages a sequence took from another instead of its own, since start
        self.unequal = 0  # candidates whose K/V differed from the sequence's own (kept apart)

    def __len__(self) -> int:
        return len(self._page)

    def _forget(self, page: PageId) -> None:
        key = self._key.pop(page, None)
        if key is not None:
            del self._page[key]

    def _same(self, a: PageId, b: PageId) -> bool:
        """Pages `a` and `b` hold the same K/V, bit for bit, in every layer."""
        size = self.pool.config.page_size
        sa, sb = slice(a * size, (a + 1) * size), slice(b * size, (b + 1) * size)
        keys, values = self.pool.keys, self.pool.values
        return torch.equal(keys[:, sa], keys[:, sb]) and torch.equal(values[:, sa], values[:, sb])

    def share(self, seq: SequenceKV, chain: Sequence[str]) -> int:
        """After `seq`'s prefill: each of its full pages whose chain id (`chain[i]`, page i) is
        registered to a page with the same K/V becomes that page (its own given back); each
        other full page is registered, when its chain id is free, for later sequences.
        Returns the pages shared. A sequence with holes (a sliding-window layer's unloaded
        K/V) takes no part."""
        if seq.holes is not None:
            return 0
        full = min(len(chain), seq.num_tokens // self.pool.config.page_size)
        shared = 0
        for i in range(full):
            own, key = seq.table.pages[i], chain[i]
            other = self._page.get(key)
            if other == own:
                continue
            if other is None:
                if own not in self._key:
                    self._page[key], self._key[own] = own, key
                continue
            if self._same(own, other):
                seq.share_page(i, other)
                shared += 1
            else:
                self.unequal += 1
        self.shared += shared
        return shared
