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

    `candidates` and `settle` change the pool and the registry: the caller holds the lock the
    pool's other users hold; `equal`, which reads a page of every layer twice per page
    compared, need not."""

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

    def candidates(self, seq: SequenceKV, chain: Sequence[str]) -> list[tuple[int, PageId]]:
        """Under the pool's lock, after `seq`'s prefill: (index, page) for each full page of
        `seq` whose chain id (`chain[i]`, page i) is registered to another page, that page
        pinned (a reference taken) so that it stays as it is while `equal` reads it outside
        the lock; `settle` drops the pins. Nothing for a sequence with holes (a sliding-window
        layer's unloaded K/V): it takes no part."""
        if seq.holes is not None:
            return []
        found = []
        for i in range(self._full(seq, chain)):
            other = self._page.get(chain[i])
            if other is not None and other != seq.table.pages[i]:
                self.pool.incref(other)
                found.append((i, other))
        return found

    def equal(self, seq: SequenceKV, candidates: list[tuple[int, PageId]]) -> list[bool]:
        """Whether each candidate page holds the same K/V as `seq`'s page at its index, bit for
        bit, in every layer. Reads only pages nothing writes (`seq`'s full prompt pages, pinned
        registered pages), so it may run outside the pool's lock; consecutive pages on both
        sides are compared as one run."""
        pairs = [(seq.table.pages[i], other) for i, other in candidates]
        out: list[bool] = []
        start = 0
        while start < len(pairs):
            end = start + 1  # the run: own and other pages both consecutive
            while (end < len(pairs) and pairs[end][0] == pairs[end - 1][0] + 1
                   and pairs[end][1] == pairs[end - 1][1] + 1):  # fmt: skip
                end += 1
            if self._same(pairs[start][0], pairs[start][1], end - start):
                out += [True] * (end - start)
            else:  # some page of the run differs: page by page
                out += [self._same(p, q) for p, q in pairs[start:end]]
            start = end
        return out

    def settle(
        self, seq: SequenceKV, chain: Sequence[str], candidates: list[tuple[int, PageId]],
        equal: list[bool],
    ) -> int:  # fmt: skip
        """Under the pool's lock: each candidate found equal becomes `seq`'s page (its own
        given back), every pin is dropped, and each other full page of `seq` is registered
        when its chain id is free. Returns the pages shared."""
        taken = []
        for (i, other), same in zip(candidates, equal, strict=True):
            if same and self._page.get(chain[i]) == other:
                taken.append((i, other))
            elif not same:
                self.unequal += 1
        seq.share_pages(taken)
        self.pool.release([other for _, other in candidates])  # the pins
        shared = len(taken)
        if seq.holes is None:
            for i in range(self._full(seq, chain)):
                own = seq.table.pages[i]
                if chain[i] not in self._page and own not in self._key:
                    self._page[chain[i]], self._key[own] = own, chain[i]
        self.shared += shared
        return shared

    def share(self, seq: SequenceKV, chain: Sequence[str]) -> int:
        """`candidates`, `equal` and `settle` at once, all under the caller's lock: after
        `seq`'s prefill, each of its full pages whose chain id is registered to a page with
        the same K/V becomes that page (its own given back); each other full page is
        registered, when its chain id is free, for later sequences. Returns the pages
        shared."""
        found = self.candidates(seq, chain)
        return self.settle(seq, chain, found, self.equal(seq, found))

    def _full(self, seq: SequenceKV, chain: Sequence[str]) -> int:
        """The full pages of `seq` that `chain` names."""
        return min(len(chain), seq.num_tokens // self.pool.config.page_size)

    def _same(self, a: PageId, b: PageId, pages: int = 1) -> bool:
        """The `pages` pages from `a` and from `b` hold the same K/V, bit for bit, in every
        layer."""
        size = self.pool.config.page_size
        sa = slice(a * size, (a + pages) * size)
        sb = slice(b * size, (b + pages) * size)
        keys, values = self.pool.keys, self.pool.values
        return torch.equal(keys[:, sa], keys[:, sb]) and torch.equal(values[:, sa], values[:, sb])
