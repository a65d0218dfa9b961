"""Fast tier in CUDA memory, host tier pinned (run with -m gpu on a CUDA machine)."""

from __future__ import annotations

import pytest
import torch

from agentcache.tiers import MemoryTier, PageData, PageKey


@pytest.mark.gpu
def test_cuda_fast_tier_and_pinned_host_tier_roundtrip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    page = PageData(torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 8), torch.arange(16))
    fast = MemoryTier("fast", 1 << 20, "cuda")
    host = MemoryTier("host", 1 << 20, "cpu", pin=True)
    fast.write([(PageKey("a/0"), page)])
    host.write([(PageKey("a/0"), page)])
    got = fast.read(PageKey("a/0"))
    assert got is not None and got.keys.is_cuda
    assert torch.equal(got.keys.cpu(), page.keys)
    held = host.read(PageKey("a/0"))
    assert held is not None and torch.equal(held.values, page.values)
