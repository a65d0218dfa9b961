"""Pages held in common (kv/shared.py): a sequence takes a running one's full page only when
its chain id and its K/V bits match; pages are forgotten when their last holder lets go."""

from __future__ import annotations

import pytest
import torch

from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.kv.shared import SharedPages

L, HKV, DH, PAGE = 2, 2, 4, 4


def make_pool(num_pages: int = 16) -> PagePool:
    return PagePool(PoolConfig(L, HKV, DH, num_pages=num_pages, page_size=PAGE))


def kv_of(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V that depend on every token up to each one (as a model's do): (L, n, Hkv, Dh)."""
    t = torch.tensor(tokens, dtype=torch.float32).cumsum(0)
    keys = t.view(1, -1, 1, 1).expand(L, -1, HKV, DH).clone()
    return keys, -keys


def filled(pool: PagePool, tokens: list[int]) -> SequenceKV:
    seq = SequenceKV(pool)
    keys, values = kv_of(tokens)
    seq.write_all(seq.extend(len(tokens)), keys, values)
    return seq


def chain(tokens: list[int]) -> list[str]:
    """Stand-in chain ids: a page's id names every token before its end."""
    return [str(tokens[: (i + 1) * PAGE]) for i in range(len(tokens) // PAGE)]


def read(seq: SequenceKV) -> tuple[torch.Tensor, torch.Tensor]:
    return seq.gather_all(slice(0, seq.num_tokens))


DOC = list(range(1, 9))  # two full pages


def registered() -> tuple[PagePool, SharedPages, SequenceKV]:
    """A pool with its registry, and a sequence of `DOC` whose pages are registered."""
    pool = make_pool()
    shared = SharedPages(pool)
    a = filled(pool, DOC)
    shared.share(a, chain(DOC))
    return pool, shared, a


def test_a_sequence_takes_the_matching_full_pages_of_a_running_one() -> None:
    pool = make_pool()
    shared = SharedPages(pool)
    doc = list(range(1, 11))  # 10 tokens: two full pages and a partial one
    a = filled(pool, doc)
    assert shared.share(a, chain(doc)) == 0 and len(shared) == 2  # registered, nothing taken
    b_tokens = [*doc[:8], 42, 43, 44]  # same two pages, then its own
    b = filled(pool, b_tokens)
    before = read(b)
    used = pool.num_used
    assert shared.share(b, chain(b_tokens)) == 2
    assert b.table.pages[:2] == a.table.pages[:2]
    assert b.table.pages[2] != a.table.pages[2]  # the partial page is never shared
    assert pool.num_used == used - 2  # its own two pages given back
    assert [pool.refcount(p) for p in a.table.pages[:2]] == [2, 2]
    after = read(b)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    # its slots and runs follow the pages it holds now
    size = PAGE
    expect = torch.cat([torch.arange(p * size, (p + 1) * size) for p in b.table.pages])
    assert torch.equal(b.slots(), expect[: b.num_tokens])
    covered = sorted(s for a0, b0 in b.spans() for s in range(a0, b0))
    assert covered == sorted(b.slots().tolist())
    assert shared.shared == 2


def test_different_bits_under_the_same_chain_are_kept_apart() -> None:
    """A page whose K/V differs (another way of coming by it) keeps its own page."""
    pool, shared, a = registered()
    doc = DOC
    b = filled(pool, doc)
    slots = b.slots()[PAGE:]  # the second page's K nudged, as a re-rotated copy would differ
    pool.keys[1, slots] += 1e-6
    assert shared.share(b, chain(doc)) == 1  # the first page only
    assert b.table.pages[0] == a.table.pages[0] and b.table.pages[1] != a.table.pages[1]
    assert shared.unequal == 1


def test_other_chains_are_never_candidates() -> None:
    """Another scope's chain (another tenant) never finds the page, whatever its bits."""
    pool, shared, a = registered()
    doc = DOC
    b = filled(pool, doc)
    other = [f"salt:{c}" for c in chain(doc)]
    assert shared.share(b, other) == 0
    assert set(b.table.pages).isdisjoint(a.table.pages)


def test_a_page_is_forgotten_when_its_last_holder_lets_go() -> None:
    pool, shared, a = registered()
    doc = DOC
    b = filled(pool, doc)
    shared.share(b, chain(doc))
    assert pool.num_shared == 2
    a.free()
    assert pool.num_shared == 0  # held by b alone now
    assert len(shared) == 2  # b holds them still
    assert pool.num_used == 2
    b_keys = read(b)[0].clone()
    c = filled(pool, [99] * 8)  # takes the free pages a gave back: nothing of b's is touched
    assert torch.equal(read(b)[0], b_keys)
    b.free()
    assert len(shared) == 0 and pool.num_used == len(c.table.pages)
    # a page freed and handed out again is not found under its old chain id
    d = filled(pool, doc)
    assert shared.share(d, chain(doc)) == 0


def test_sequences_with_holes_take_no_part_and_a_pool_takes_one_registry() -> None:
    pool = make_pool()
    shared = SharedPages(pool)
    doc = list(range(1, 9))
    a = filled(pool, doc)
    a.holes = torch.zeros(8, dtype=torch.bool)
    assert shared.share(a, chain(doc)) == 0 and len(shared) == 0
    with pytest.raises(ValueError, match="on_free"):
        SharedPages(pool)


def test_share_pages_refuses_a_page_that_is_not_full() -> None:
    pool = make_pool()
    a = filled(pool, list(range(6)))
    b = filled(pool, list(range(6)))
    with pytest.raises(ValueError, match="not full"):
        b.share_pages([(1, a.table.pages[1])])


def test_a_candidate_is_pinned_while_it_is_compared_outside_the_lock() -> None:
    """`candidates` takes a reference on each page it found, so a holder that lets go while
    `equal` reads it (outside the lock) leaves it as it was; `settle` drops the pins."""
    pool, shared, a = registered()
    doc = DOC
    pages = list(a.table.pages)
    b = filled(pool, doc)
    found = shared.candidates(b, chain(doc))
    assert [p for _, p in found] == pages and [pool.refcount(p) for p in pages] == [2, 2]
    a.free()  # its holder leaves meanwhile: the pins keep the pages
    assert [pool.refcount(p) for p in pages] == [1, 1] and len(shared) == 2
    filled(pool, [7] * 8)  # a newcomer takes free pages, never the pinned ones
    equal = shared.equal(b, found)
    assert equal == [True, True]
    assert shared.settle(b, chain(doc), found, equal) == 2
    assert b.table.pages[:2] == pages and [pool.refcount(p) for p in pages] == [1, 1]
    b.free()
    assert len(shared) == 0
