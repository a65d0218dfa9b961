"""The rankers' attention is the layer's own: causal, and on a sliding-window layer only the
last W keys of each query, in prompt indices even when the keys are a subset of the prompt."""

from __future__ import annotations

import pytest
import torch

from agentcache.model.attention import attention, causal_mask
from agentcache.reuse.ranking.probs import attention_probs, attention_probs_reference


@pytest.mark.parametrize("window", [None, 1, 5, 40])
def test_attention_probs_agree_with_the_plain_formulation(window: int | None) -> None:
    g = torch.Generator().manual_seed(0)
    q, keys = torch.randn(6, 4, 8, generator=g), torch.randn(30, 2, 8, generator=g)
    q_idx = torch.tensor([3, 9, 10, 20, 28, 29])
    got = attention_probs(q, q_idx, keys, 0.3, window)
    want = attention_probs_reference(q, q_idx, keys, 0.3, window)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    seen = causal_mask(q_idx, 30, window)  # (W, T)
    assert bool((got[:, ~seen] == 0).all()) and bool((got[:, seen] > 0).all())


def test_the_probabilities_weigh_the_values_as_the_layers_attention_does() -> None:
    g = torch.Generator().manual_seed(1)
    q, keys, values = (torch.randn(n, h, 8, generator=g) for n, h in ((5, 4), (30, 2), (30, 2)))
    q_idx = torch.tensor([10, 14, 20, 25, 29])
    probs = attention_probs(q, q_idx, keys, 0.35, 7)  # (H, W, T)
    mixed = torch.einsum("hwt,thd->whd", probs, values.repeat_interleave(2, dim=1))
    want = attention(q, keys, values, q_idx, 0.35, 7).view(5, 4, 8)
    torch.testing.assert_close(mixed, want, rtol=0, atol=1e-5)


def test_a_subset_of_keys_is_masked_by_prompt_index() -> None:
    key_index = torch.tensor([0, 1, 2, 10, 11, 12, 30])  # a probe's context, gaps between
    mask = causal_mask(torch.tensor([12, 30]), 7, 5, key_index)
    assert mask.tolist() == [[False, False, False, True, True, True, False],
                             [False, False, False, False, False, False, True]]  # fmt: skip
