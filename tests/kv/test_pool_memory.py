"""The pool's memory: sized by bytes, taken as pages are first used, never moved."""

from __future__ import annotations

import os

import pytest
import torch

from agentcache.errors import OutOfPagesError
from agentcache.kv.pool import PageId, PagePool, PoolConfig, SequenceKV
from agentcache.units import GiB

L, HKV, DH = 3, 2, 4
PAGE_BYTES = 2 * L * 4 * HKV * DH * 4  # page_size 4, fp32


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_from_bytes_takes_the_whole_pages_the_bytes_hold() -> None:
    c = PoolConfig.from_bytes(L, HKV, DH, 10 * PAGE_BYTES + PAGE_BYTES - 1, page_size=4)
    assert c.num_pages == 10 and c.page_bytes == PAGE_BYTES
    assert c.pool_bytes == 10 * PAGE_BYTES


def test_from_bytes_below_one_page_names_both_sizes() -> None:
    with pytest.raises(ValueError) as e:
        PoolConfig.from_bytes(L, HKV, DH, PAGE_BYTES - 1, page_size=4)
    assert f"kv_bytes={PAGE_BYTES - 1}" in str(e.value)
    assert f"{PAGE_BYTES} bytes" in str(e.value)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux resident size")
def test_a_large_pool_holds_memory_only_for_the_pages_used() -> None:
    # (layers, heads, dim) of a small model; 2 GiB of pages
    config = PoolConfig.from_bytes(30, 3, 64, 2 * GiB)
    before = rss_bytes()
    pool = PagePool(config)
    assert rss_bytes() - before < 64 << 20  # reserved, not filled
    seq = SequenceKV(pool)
    slots = seq.extend(4 * config.page_size)
    keys = torch.ones((config.num_layers, len(slots), 3, 64))
    seq.write_all(slots, keys, keys)
    assert pool.touched_pages == 4
    assert pool.resident_bytes == 4 * config.page_bytes
    assert rss_bytes() - before < 64 << 20
    assert torch.equal(seq.gather_all(slice(None))[0], keys)


def test_pages_never_used_read_zero_and_are_taken_after_released_ones() -> None:
    pool = PagePool(PoolConfig(L, HKV, DH, num_pages=6, page_size=4))
    a = pool.allocate(2)
    pool.keys[:, 0:8] = 7.0
    pool.release(a)
    assert pool.touched_pages == 2 and pool.num_free == 6
    assert pool.allocate(3) == [PageId(1), PageId(0), PageId(2)]  # released (LIFO), then fresh
    assert pool.touched_pages == 3
    assert float(pool.keys[:, 8:12].abs().sum()) == 0.0  # page 2: never written
    assert pool.num_used == 3 and pool.num_free == 3


def test_a_view_taken_before_an_allocation_sees_writes_after_it() -> None:
    pool = PagePool(PoolConfig(L, HKV, DH, num_pages=64, page_size=4))
    view = pool.keys[1]  # (slots, Hkv, Dh): readers hold such views across allocations
    seq = SequenceKV(pool)
    slots = seq.extend(200)
    k = torch.randn((200, HKV, DH))
    seq.write(1, slots, k, k)
    assert torch.equal(view[slots], k)


def test_allocate_run_spans_released_and_fresh_pages() -> None:
    pool = PagePool(PoolConfig(L, HKV, DH, num_pages=8, page_size=4))
    a = pool.allocate(3)  # 0, 1, 2
    pool.release([a[2]])  # 2 free, 3.. fresh
    assert pool.allocate_run(3) == [PageId(2), PageId(3), PageId(4)]
    assert pool.touched_pages == 5 and pool.num_free == 3
    assert pool.allocate(3) == [PageId(5), PageId(6), PageId(7)]
    with pytest.raises(OutOfPagesError, match=r"holds \d+ bytes"):
        pool.allocate(1)
