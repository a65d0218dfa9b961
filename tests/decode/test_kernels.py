"""The verify pass's attention: read the keys before the last tokens once, unmasked, and merge
the last tokens' causal part by log-sum-exp; the masked attention is the reference."""

from __future__ import annotations

import pytest
import torch

from agentcache.decode.kernels import last_tokens_attention
from agentcache.model.llama import attention


@pytest.mark.parametrize(("s", "n", "g"), [(300, 8, 3), (65, 1, 1), (16, 16, 3), (1000, 5, 4)])
def test_last_tokens_attention_equals_the_masked_reference(s: int, n: int, g: int) -> None:
    gen = torch.Generator().manual_seed(s + n + g)
    q = torch.randn(n, g, 32, generator=gen)
    k, v = torch.randn(s, 32, generator=gen), torch.randn(s, 32, generator=gen)
    k[5] *= 8  # one key that dominates: the merge must weigh the two parts right
    got = last_tokens_attention(q, k, v, 32**-0.5)
    want = attention(q, k[:, None], v[:, None], None, 32**-0.5)
    assert got.shape == (n, g * 32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_each_last_token_sees_the_tokens_before_it_and_none_after() -> None:
    """A key that only the last token may see: changing it moves the last row alone."""
    q, k, v = torch.randn(4, 2, 16), torch.randn(40, 16), torch.randn(40, 16)
    before = last_tokens_attention(q, k, v, 0.25)
    v2 = v.clone()
    v2[-1] += 100.0
    after = last_tokens_attention(q, k, v2, 0.25)
    assert torch.equal(after[:3], before[:3])
    assert not torch.allclose(after[3], before[3])
