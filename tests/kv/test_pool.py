from __future__ import annotations

import itertools

import pytest
import torch

from agentcache.errors import OutOfPagesError
from agentcache.kv.pool import BlockTable, PageId, PagePool, PoolConfig, SequenceKV

L, HKV, DH = 3, 2, 4


def make_pool(num_pages: int = 4, page_size: int = 4) -> PagePool:
    return PagePool(PoolConfig(L, HKV, DH, num_pages=num_pages, page_size=page_size))


def test_pool_config_rejects_empty_pool_and_counts_page_bytes() -> None:
    with pytest.raises(ValueError, match="num_pages and page_size"):
        PoolConfig(L, HKV, DH, num_pages=0)
    with pytest.raises(ValueError, match="num_pages and page_size"):
        PoolConfig(L, HKV, DH, num_pages=1, page_size=0)
    c = PoolConfig(L, HKV, DH, num_pages=2, page_size=4)
    assert c.page_bytes == 2 * L * 4 * HKV * DH * 4  # K and V, fp32
    assert PoolConfig(L, HKV, DH, 2, 4, torch.float16).page_bytes == c.page_bytes // 2


def test_allocate_hands_out_lowest_ids_first_and_counts_refs() -> None:
    pool = make_pool(num_pages=5)
    assert pool.num_free == 5 and pool.num_used == 0
    first = pool.allocate(3)
    assert first == [0, 1, 2]
    assert [pool.refcount(p) for p in range(5)] == [1, 1, 1, 0, 0]
    assert pool.allocate(1) == [3]
    assert pool.num_free == 1 and pool.num_used == 4
    assert pool.peak_pages_used == 4


def test_released_pages_are_reused_last_in_first_out() -> None:
    pool = make_pool(num_pages=5)
    pages = pool.allocate(3)
    pool.release(pages)
    assert pool.num_free == 5
    assert [pool.refcount(p) for p in pages] == [0, 0, 0]
    # the free list is a stack: the most recently released page comes back first
    assert pool.allocate(3) == [2, 1, 0]
    assert pool.allocate(2) == [3, 4]
    assert pool.peak_pages_used == 5


def test_incref_keeps_page_until_last_release() -> None:
    pool = make_pool()
    (page,) = pool.allocate(1)
    pool.incref(page)
    assert pool.refcount(page) == 2
    pool.release([page])
    assert pool.refcount(page) == 1
    assert pool.num_free == 3  # still held by the second reference
    pool.release([page])
    assert pool.refcount(page) == 0
    assert pool.num_free == 4


def test_incref_of_free_page_raises() -> None:
    pool = make_pool()
    with pytest.raises(ValueError, match="page 2 is free"):
        pool.incref(PageId(2))


def test_double_release_raises() -> None:
    pool = make_pool()
    pages = pool.allocate(2)
    pool.release(pages)
    with pytest.raises(ValueError, match=r"page 0 released twice"):
        pool.release([pages[0]])
    assert pool.num_free == 4  # the failed release did not push page 0 onto the free list again


def test_out_of_pages_message_and_no_partial_allocation() -> None:
    pool = make_pool(num_pages=4)
    pool.allocate(3)
    with pytest.raises(OutOfPagesError) as e:
        pool.allocate(2)
    msg = str(e.value)
    assert "need 2 KV pages" in msg
    assert "only 1 of 4 are free" in msg
    assert "kv_pages" in msg  # names the fix
    assert pool.num_free == 1  # nothing was taken


def test_block_table_slot_arithmetic() -> None:
    t = BlockTable(page_size=4, pages=[PageId(3), PageId(1), PageId(7)], num_tokens=10)
    assert t.slots().tolist() == [12, 13, 14, 15, 4, 5, 6, 7, 28, 29]
    assert t.slots(3, 6).tolist() == [15, 4, 5]
    assert t.slots(9).tolist() == [29]
    assert t.slots(5, 5).tolist() == []
    assert t.slots().dtype == torch.int64


def test_block_table_pages_needed() -> None:
    t = BlockTable(page_size=4, pages=[PageId(0), PageId(1)], num_tokens=6)
    assert t.pages_needed(8) == 0
    assert t.pages_needed(9) == 1
    assert t.pages_needed(16) == 2
    assert BlockTable(page_size=4).pages_needed(1) == 1
    assert BlockTable(page_size=4).pages_needed(0) == 0


def test_sequence_extend_allocates_pages_lazily() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    seq = SequenceKV(pool)
    assert seq.extend(3).tolist() == [0, 1, 2]
    assert pool.num_used == 1
    assert seq.extend(2).tolist() == [3, 4]
    assert seq.table.pages == [0, 1]
    assert seq.num_tokens == 5
    assert seq.slots().tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(OutOfPagesError):
        seq.extend(12)  # 17 tokens need 5 pages; the pool has 4


def test_sequence_slots_follow_non_contiguous_pages() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    other = SequenceKV(pool)
    other.extend(4)  # takes page 0
    seq = SequenceKV(pool)
    seq.extend(2)  # page 1
    other.extend(4)  # page 2
    seq.extend(4)  # fills page 1, then page 3
    assert seq.table.pages == [1, 3]
    assert seq.slots().tolist() == [4, 5, 6, 7, 12, 13]


def _kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(L, n, HKV, DH, generator=g), torch.randn(L, n, HKV, DH, generator=g)


def test_write_gather_round_trip_per_layer() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    seq = SequenceKV(pool)
    keys, values = _kv(6, 0)
    first = seq.extend(4)
    second = seq.extend(2)
    for layer in range(L):
        seq.write(layer, first, keys[layer, :4], values[layer, :4])
        seq.write(layer, second, keys[layer, 4:], values[layer, 4:])
    for layer in range(L):
        k, v = seq.gather(layer)
        assert torch.equal(k, keys[layer]) and torch.equal(v, values[layer])
        k3, v3 = seq.gather(layer, end=3)
        assert torch.equal(k3, keys[layer, :3]) and torch.equal(v3, values[layer, :3])
    # gather returns copies: writing to them leaves the pool alone
    k, _ = seq.gather(0)
    k.zero_()
    assert torch.equal(seq.gather(0)[0], keys[0])


def test_write_all_gather_all_round_trip() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    seq = SequenceKV(pool)
    keys, values = _kv(7, 1)
    slots = seq.extend(7)
    seq.write_all(slots, keys, values)
    k, v = seq.gather_all(slice(0, 7))
    assert torch.equal(k, keys) and torch.equal(v, values)
    k, v = seq.gather_all(slice(2, 6))
    assert torch.equal(k, keys[:, 2:6]) and torch.equal(v, values[:, 2:6])
    # per-layer gather sees the same data as the all-layer write
    assert torch.equal(seq.gather(2)[1], values[2])


def _shares(t: torch.Tensor, base: torch.Tensor) -> bool:
    return t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_read_all_is_a_view_of_slots_in_order_else_gather_alls_copy() -> None:
    """Tokens whose slots are one run in token order are read in place (views of the pool);
    any other layout (pages apart, or a span across them) comes back as `gather_all`'s copy.
    Either way the same K/V as `gather_all`."""
    pool = make_pool(num_pages=6, page_size=4)
    seq, other = SequenceKV(pool), SequenceKV(pool)
    keys, values = _kv(12, 4)
    seq.write_all(seq.extend(6), keys[:, :6], values[:, :6])  # pages 0, 1
    other.extend(4)  # page 2
    seq.write_all(seq.extend(6), keys[:, 6:], values[:, 6:])  # fills page 1, then 3
    for span, in_place in ((slice(0, 8), True), (slice(2, 7), True), (slice(0, 12), False),
                           (slice(6, 10), False), (slice(8, 12), True)):  # fmt: skip
        k, v = seq.read_all(span)
        gk, gv = seq.gather_all(span)
        assert torch.equal(k, gk) and torch.equal(v, gv), span
        assert _shares(k, pool.keys) == _shares(v, pool.values) == in_place, span
    k, _ = seq.read_all(slice(0, 8))
    assert k.data_ptr() == pool.keys[:, 0].data_ptr()  # a view: what the pool holds now
    assert seq.read_all(slice(3, 3))[0].shape == (L, 0, HKV, DH)


def test_sequences_do_not_overwrite_each_other() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    a, b = SequenceKV(pool), SequenceKV(pool)
    ka, va = _kv(5, 2)
    kb, vb = _kv(5, 3)
    a.write_all(a.extend(5), ka, va)
    b.write_all(b.extend(5), kb, vb)
    assert torch.equal(a.gather_all(slice(None))[0], ka)
    assert torch.equal(b.gather_all(slice(None))[1], vb)


def test_free_returns_pages_and_resets_sequence() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    seq = SequenceKV(pool)
    seq.extend(9)
    assert pool.num_free == 1
    seq.free()
    assert pool.num_free == 4
    assert seq.num_tokens == 0 and seq.table.pages == [] and seq.slots().numel() == 0
    # usable again after free; page 2 (released last) comes back first
    assert seq.extend(1).tolist() == [8]


def _span_slots(seq: SequenceKV) -> list[int]:
    return [s for a, b in seq.spans() for s in range(a, b)]


def test_spans_of_consecutive_pages_are_one_run() -> None:
    seq = SequenceKV(make_pool(num_pages=4, page_size=4))
    seq.extend(3)
    assert seq.spans() == [(0, 3)]
    seq.extend(6)  # fills page 0, then pages 1 and 2
    assert seq.spans() == [(0, 9)]


def test_spans_of_descending_pages_merge_once_a_page_fills() -> None:
    pool = make_pool(num_pages=4, page_size=4)
    first = SequenceKV(pool)
    first.extend(12)
    first.free()  # pages 0, 1, 2 return; the next sequence gets 2, 1, 0
    seq = SequenceKV(pool)
    seq.extend(6)
    assert seq.table.pages == [2, 1]
    assert seq.spans() == [(4, 6), (8, 12)]  # page 1 half full
    seq.extend(2)
    assert seq.spans() == [(4, 12)]
    seq.extend(1)
    assert seq.spans() == [(0, 1), (4, 12)]


def test_spans_hold_every_slot_once_over_fragmented_pages() -> None:
    pool = make_pool(num_pages=8, page_size=4)
    a, b = SequenceKV(pool), SequenceKV(pool)
    for n in (3, 5, 1, 4, 6):
        a.extend(n)
        b.extend(2)
    assert sorted(_span_slots(a)) == sorted(a.slots().tolist())
    assert sorted(_span_slots(b)) == sorted(b.slots().tolist())
    assert all(e < s for (_, e), (s, _) in itertools.pairwise(a.spans()))
    a.free()
    assert a.spans() == []


def test_spans_follow_pages_appended_to_the_table() -> None:
    pool = make_pool(num_pages=6, page_size=4)
    seq = SequenceKV(pool)
    seq.extend(4)  # page 0
    seq.table.pages.extend(pool.allocate(2)[::-1])  # pages 2, 1 taken ahead of the tokens
    seq.extend(6)
    assert seq.slots().tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5]
    assert seq.spans() == [(0, 6), (8, 12)]
