"""Per-head paged KV: placement, promotion, slot reuse, null pages, dirty rows."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.setup import DecodeSetup
from agentcache.decode.store import NULL_PAGE, HeadPagedKV
from agentcache.errors import OutOfPagesError
from agentcache.model.loading import LoadedModel


def store(capacity: int = 4) -> tuple[HeadPagedKV, torch.Tensor]:
    """One layer, two heads: head 0 resident, head 1 offloaded with `capacity` slots; 10 pages."""
    offload = torch.tensor([[False, True]])
    kv = HeadPagedKV(2, 4, 12, torch.tensor([[99, capacity]]), offload)
    keys = torch.arange(40 * 2 * 2, dtype=torch.float32).view(1, 40, 2, 2)
    kv.load(keys, -keys)
    return kv, keys


def page_of(keys: torch.Tensor, head: int, page: int) -> torch.Tensor:
    return keys[0, page * 4 : (page + 1) * 4, head]


def test_load_keeps_resident_heads_whole_and_offloaded_heads_in_host() -> None:
    kv, keys = store()
    assert kv.resident_pages(0, 0) == list(range(10))
    assert kv.resident_pages(0, 1) == []
    assert torch.equal(kv.host_k[0, 3], page_of(keys, 1, 3))
    assert kv.fast_tier_bytes == (12 + 4) * kv.page_bytes
    assert kv.host_tier_bytes == 12 * kv.page_bytes


def test_place_promotes_only_new_pages_and_reuses_evicted_slots() -> None:
    kv, keys = store()
    head = torch.tensor([1])
    assert kv.place(0, head, torch.tensor([[0, 2, 5, 9]])) == 4
    slots_before = kv.table[0, 1, [0, 2, 5, 9]].tolist()
    assert kv.place(0, head, torch.tensor([[0, 5, 7, -1]])) == 1  # only page 7 is new
    assert kv.resident_pages(0, 1) == [0, 5, 7]
    assert kv.table[0, 1, 2] == NULL_PAGE and kv.table[0, 1, 9] == NULL_PAGE
    assert kv.table[0, 1, 7] in slots_before  # an evicted slot, reused
    assert kv.table[0, 1, 5] == slots_before[2]  # kept pages do not move
    kv.sync(0)
    k, v = kv.gather(0, torch.tensor([[0, 5, 7], [0, 5, 7]]))
    assert torch.equal(k[1, 8:12], page_of(keys, 1, 7))
    assert torch.equal(v[1, 8:12], -page_of(keys, 1, 7))
    assert torch.equal(k[0, 4:8], page_of(keys, 0, 5))


def test_padding_reads_the_null_page() -> None:
    kv, _ = store()
    kv.sync(0)
    k, _ = kv.gather(0, torch.tensor([[3, -1], [-1, -1]]))
    assert bool((k[:, 4:] == 0).all()) and bool((k[1] == 0).all())


def test_more_wanted_pages_than_slots_is_an_error() -> None:
    kv, _ = store(capacity=2)
    with pytest.raises(OutOfPagesError, match="slots"):
        kv.place(0, torch.tensor([1]), torch.tensor([[0, 1, 2]]))


def test_sync_copies_only_dirty_rows() -> None:
    kv, _ = store()
    kv.sync(0)
    assert kv.rows_synced == 2 and torch.equal(kv.table_fast, kv.table)
    kv.place(0, torch.tensor([1]), torch.tensor([[0, 1, -1, -1]]))
    assert kv.dirty.tolist() == [[False, True]]
    kv.sync(0)
    assert kv.rows_synced == 3 and torch.equal(kv.table_fast, kv.table)
    kv.place(0, torch.tensor([1]), torch.tensor([[0, 1, -1, -1]]))  # nothing changes
    kv.sync(0)
    assert kv.rows_synced == 3


def test_new_tokens_open_pages_and_reach_the_host_copy() -> None:
    kv, _ = store()
    kv.place(0, torch.tensor([1]), torch.tensor([[0, 9, -1, -1]]))
    t = kv.append_token()  # token 40 opens page 10
    assert t == 40 and 10 in kv.resident_pages(0, 1) and 10 in kv.resident_pages(0, 0)
    kv.write(0, t, torch.full((2, 2), 5.0), torch.full((2, 2), 6.0))
    assert bool((kv.host_k[0, 10, 0] == 5.0).all()) and bool((kv.host_v[0, 10, 0] == 6.0).all())
    kv.sync(0)
    k, _ = kv.gather(0, torch.tensor([[10], [10]]))
    assert bool((k[:, 0] == 5.0).all())


def test_flexicache_decode_attends_only_resident_pages_within_capacity(
    tiny: LoadedModel, profile_file: Path
) -> None:
    c = tiny.config
    torch.manual_seed(0)
    keys = torch.randn(c.num_layers, 300, c.num_kv_heads, c.head_dim)
    config = DecodeConfig("flexicache", budget_pages=4, profile=profile_file)
    plan = DecodeSetup.resolve(tiny, config).plan
    dec = SparseDecoder(tiny.forward, plan, config, keys, keys.clone(), 400)
    arena_rows = len(dec.kv.arena_k)
    for i in range(70):
        dec.step(i % 200, 300 + i)
        for layer in range(c.num_layers):
            pages = dec.pages(layer)
            rows = dec.kv.table_fast[layer].gather(1, pages.clamp(min=0))
            assert bool((rows[pages >= 0] != NULL_PAGE).all()), f"step {i} layer {layer}"
            for h in range(c.num_kv_heads):
                n = len(dec.kv.resident_pages(layer, h))
                assert n <= int(dec.kv.capacity[layer, h])
    stats = dec.stats()
    assert len(dec.kv.arena_k) == arena_rows
    assert stats.rerank_steps == 4  # steps 16, 32, 48, 64 (step 0 is the initial placement)
    assert stats.pages_promoted > 0 and stats.initial_pages_promoted > 0
    assert stats.bytes_promoted == stats.pages_promoted * dec.kv.page_bytes
    # unstable heads (0, 1) and (2, 0) rerank every step, the six stable heads every 16
    assert stats.head_reranks == 70 * 2 + 5 * 6
    assert bool(dec.kv.offload.sum() == 6)


def test_budget_larger_than_context_is_clamped_with_a_warning(tiny: LoadedModel) -> None:
    c = tiny.config
    keys = torch.randn(c.num_layers, 100, c.num_kv_heads, c.head_dim)
    plan = DecodeSetup.resolve(tiny, DecodeConfig("quest")).plan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = SparseDecoder(tiny.forward, plan, DecodeConfig("quest", 64), keys, keys, 120)
    assert any("clamped to 5" in str(w.message) for w in caught)
    assert dec.stats().budget_pages == 5 and dec.stats().budget_clamped


@pytest.mark.parametrize("budget", [0, -3])
def test_budget_of_zero_or_less_is_rejected(budget: int) -> None:
    with pytest.raises(ValueError, match="budget_pages must be >= 1"):
        DecodeConfig("quest", budget_pages=budget)


def padded_load(kv: HeadPagedKV, keys: torch.Tensor, values: torch.Tensor) -> None:
    """The reference load: the KV padded to whole pages, permuted, then scattered."""
    n_layers, t, hkv, dh = keys.shape
    pages = -(-t // kv.page_size)
    pad = pages * kv.page_size - t

    def paged(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x.permute(0, 2, 1, 3), (0, 0, 0, pad))
        return x.reshape(n_layers, hkv, pages, kv.page_size, dh)

    kp, vp = paged(keys), paged(values)
    res = ~kv.offload
    rows = kv.region[res][:, None] + torch.arange(pages)
    kv.arena_k[rows.flatten()] = kp[res].reshape(-1, kv.page_size, dh)
    kv.arena_v[rows.flatten()] = vp[res].reshape(-1, kv.page_size, dh)
    kv.table[res, :pages] = rows
    kv.host_k[:, :pages] = kp[kv.offload]
    kv.host_v[:, :pages] = vp[kv.offload]
    kv.dirty[:] = True
    kv.num_tokens = t


@pytest.mark.parametrize("tokens", [1, 15, 16, 37, 48])
def test_load_equals_the_padded_reference(tokens: int) -> None:
    """Copied head by head into place, the arena, host copy and table are the reference's,
    a partial last page included (its rows past the tokens zero)."""
    torch.manual_seed(tokens)
    offload = torch.tensor([[False, True, True], [True, False, False]])
    capacity = torch.tensor([[9, 3, 4], [2, 9, 9]])
    keys, values = torch.randn(2, tokens, 3, 5), torch.randn(2, tokens, 3, 5)
    fast = HeadPagedKV(5, 16, 4, capacity, offload)
    ref = HeadPagedKV(5, 16, 4, capacity, offload)
    fast.load(keys, values)
    padded_load(ref, keys, values)
    for name in ("arena_k", "arena_v", "host_k", "host_v", "table", "dirty"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name
    assert fast.num_tokens == ref.num_tokens == tokens


def test_writing_tokens_at_once_is_writing_each() -> None:
    """`write_tokens` of 6 tokens across a page boundary leaves the arena and the host copy as
    `write` of each does."""
    one, _ = store()
    many, _ = store()
    for kv in (one, many):
        kv.place(0, torch.tensor([1]), torch.tensor([[0, 9, -1, -1]]))
        for _ in range(6):  # tokens 40..45: pages 10 and 11
            kv.append_token()
    k = torch.randn(6, 2, 2, generator=torch.Generator().manual_seed(7))
    for i in range(6):
        one.write(0, 40 + i, k[i], -k[i])
    many.write_tokens(0, 40, k, -k)
    for a, b in ((one.arena_k, many.arena_k), (one.arena_v, many.arena_v),
                 (one.host_k, many.host_k), (one.host_v, many.host_v)):  # fmt: skip
        assert torch.equal(a, b)
    assert bool((many.host_k[0, 11, 1] == k[5, 1]).all())  # written, not left as it was
