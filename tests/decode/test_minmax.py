from __future__ import annotations

import torch

from agentcache.decode.minmax import MinMaxMeta, reference_scores


def test_scores_match_the_elementwise_quest_bound() -> None:
    torch.manual_seed(0)
    keys = torch.randn(2, 100, 3, 8)  # (L, T, Hkv, Dh)
    meta = MinMaxMeta(2, 3, 8, max_pages=10, page_size=16)
    meta.build(keys)
    q = torch.randn(3, 2, 8)  # (Hkv, G, Dh)
    for combine, reduce in (("sum", torch.sum), ("max", torch.amax)):
        got = meta.scores(1, q, None, combine)
        for h in range(3):
            ref = reference_scores(q[h], meta.kmin[1, h, :7], meta.kmax[1, h, :7])
            torch.testing.assert_close(got[h], reduce(ref, 0), rtol=1e-5, atol=1e-5)


def test_scores_bound_every_key_of_the_page_from_above() -> None:
    torch.manual_seed(1)
    keys = torch.randn(1, 64, 1, 8)
    meta = MinMaxMeta(1, 1, 8, max_pages=4, page_size=16)
    meta.build(keys)
    q = torch.randn(1, 1, 8)
    bound = meta.scores(0, q, None, "max")[0]  # (P,)
    dots = (keys[0, :, 0] @ q[0, 0]).view(4, 16)
    assert bool((dots.amax(1) <= bound + 1e-5).all())


def test_incremental_append_equals_build_over_all_tokens() -> None:
    torch.manual_seed(2)
    keys = torch.randn(2, 53, 2, 4)
    full = MinMaxMeta(2, 2, 4, max_pages=4, page_size=16)
    full.build(keys)
    inc = MinMaxMeta(2, 2, 4, max_pages=4, page_size=16)
    inc.build(keys[:, :20])
    for t in range(20, 53):
        for layer in range(2):
            inc.append(layer, keys[layer, t], t)
    assert inc.num_pages == full.num_pages == 4
    assert torch.equal(inc.kmin, full.kmin) and torch.equal(inc.kmax, full.kmax)


def test_appending_tokens_at_once_is_appending_each() -> None:
    torch.manual_seed(4)
    keys = torch.randn(2, 53, 2, 4)
    one = MinMaxMeta(2, 2, 4, max_pages=4, page_size=16)
    many = MinMaxMeta(2, 2, 4, max_pages=4, page_size=16)
    for meta in (one, many):
        meta.build(keys[:, :29])
    for layer in range(2):
        for t in range(29, 53):  # the rest of page 1, all of page 2, part of page 3
            one.append(layer, keys[layer, t], t)
        many.append_tokens(layer, keys[layer, 29:53], 29)
    assert one.num_tokens == many.num_tokens == 53
    assert torch.equal(one.kmin, many.kmin) and torch.equal(one.kmax, many.kmax)


def test_heads_subset_scores_only_those_heads() -> None:
    torch.manual_seed(3)
    meta = MinMaxMeta(1, 3, 4, max_pages=2, page_size=16)
    meta.build(torch.randn(1, 32, 3, 4))
    q = torch.randn(3, 2, 4)
    some = meta.scores(0, q, torch.tensor([2, 0]), "sum")
    every = meta.scores(0, q, None, "sum")
    assert torch.equal(some, every[[2, 0]])


def test_build_equals_the_padded_reduction() -> None:
    """Full pages reduced on a view and the partial page on its own give the bounds of the
    keys padded to whole pages with +-inf, at every length around a page boundary."""
    torch.manual_seed(1)
    for tokens in (1, 15, 16, 17, 47, 48):
        keys = torch.randn(2, tokens, 3, 8)
        meta = MinMaxMeta(2, 3, 8, max_pages=4, page_size=16)
        meta.build(keys)
        pages = -(-tokens // 16)
        k = keys.permute(0, 2, 1, 3)
        pad = (0, 0, 0, pages * 16 - tokens)
        lo = torch.nn.functional.pad(k, pad, value=float("inf")).reshape(2, 3, pages, 16, 8)
        hi = torch.nn.functional.pad(k, pad, value=float("-inf")).reshape(2, 3, pages, 16, 8)
        assert torch.equal(meta.kmin[:, :, :pages], lo.amin(3))
        assert torch.equal(meta.kmax[:, :, :pages], hi.amax(3))
        assert bool((meta.kmin[:, :, pages:] == float("inf")).all())
        assert meta.num_tokens == tokens
