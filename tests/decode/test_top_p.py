"""Top-p page selection: the per-head budget adapts to the attention mass it must cover."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.decode.config import DecodeConfig, parse_policy_spec
from agentcache.decode.kernels import top_p_pages
from agentcache.model.loading import LoadedModel
from tests.decode.test_sparse import needle_decoder


def test_top_p_keeps_the_fewest_top_pages_covering_the_mass() -> None:
    scores = torch.tensor([[10.0, 0.0, 0.0, 0.0, 9.5], [1.0, 1.0, 1.0, 1.0, 1.0]])
    # row 0: page 0 holds e^10 / (e^10 + e^9.5 + 3) = 0.62 of the mass, page 4 0.38
    assert top_p_pages(scores, 3, 0.5, 1.0)[0].tolist() == [0, -1, -1]
    assert top_p_pages(scores, 3, 0.9, 1.0)[0].tolist() == [0, 4, -1]
    assert top_p_pages(scores, 3, 1.0, 1.0)[0, :2].tolist() == [0, 4]
    # row 1: uniform, 0.2 a page; 0.5 needs three pages, the cap k = 3 stops there
    assert (top_p_pages(scores, 3, 0.5, 1.0)[1] >= 0).sum() == 3
    assert (top_p_pages(scores, 3, 0.3, 1.0)[1] >= 0).sum() == 2
    # a smaller scale flattens row 0: more pages for the same mass
    assert (top_p_pages(scores, 3, 0.9, 0.1)[0] >= 0).sum() == 3


@pytest.mark.parametrize(("top_p", "pages"), [(0.5, 1), (1.0, 3)])
def test_a_dominant_needle_page_is_the_only_top_page_at_small_top_p(
    tiny: LoadedModel, profile_file: Path, top_p: float, pages: int
) -> None:
    dec = needle_decoder(tiny, "quest", profile_file, top_p)
    c = tiny.config
    qg = torch.ones(c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
    for layer in range(c.num_layers):
        dec._rerank(layer, qg)
        dec.kv.sync(layer)
        top = dec.sel[layer]
        assert bool((top == 20).any(1).all()) and bool(((top >= 0).sum(1) == pages).all())
        assert bool((dec._attend(layer, qg) > 6.0).all())  # the needle's value still dominates
    assert dec.stats().selected_pages_per_rerank == pages


def test_top_p_is_a_policy_option_in_range() -> None:
    assert parse_policy_spec("quest:top_p=0.9:budget=96") == (
        "quest", {"top_p": 0.9, "budget_pages": 96},
    )  # fmt: skip
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p must be in"):
            DecodeConfig("quest", top_p=bad)
    with pytest.raises(ValueError, match="top_p must be a number, got nan"):  # its type's check
        DecodeConfig("quest", top_p=float("nan"))
    with pytest.raises(ValueError, match="'top_p=x' in 'quest:top_p=x': not a number"):
        parse_policy_spec("quest:top_p=x")
