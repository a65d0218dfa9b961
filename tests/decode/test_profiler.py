"""The head profiler decodes with the model's own attention (model/attention.py: its scale and
each layer's sliding window), checked against the reference forward, and its weights are the
reference attention's."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentcache.decode.profiler import ProfileSettings, trace_heads
from agentcache.model.attention import attention, attention_probs, probs_attention
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_model

PROMPT, STEPS = 80, 12  # past the tiny configs' window of 24 tokens


@pytest.mark.parametrize("window", [None, 1, 5, 40])
@pytest.mark.parametrize("queries", [[36], [3, 17, 18, 35]])
def test_attention_probs_give_the_reference_attention(
    window: int | None, queries: list[int]
) -> None:
    torch.manual_seed(0)
    s, h, hkv, dh = 37, 6, 2, 8
    keys, values = torch.randn(s, hkv, dh), torch.randn(s, hkv, dh)
    q = torch.randn(len(queries), h, dh)
    idx = torch.tensor(queries)
    probs = attention_probs(q, keys, idx, 0.3, window)
    assert torch.allclose(probs.sum(-1), torch.ones(len(queries), h))
    seen = torch.arange(s)[None, :] <= idx[:, None]
    if window is not None:
        seen &= torch.arange(s)[None, :] > idx[:, None] - window
    assert bool((probs[~seen[:, None, :].expand_as(probs)] == 0).all())  # masked: no weight
    want = attention(q, keys, values, idx, 0.3, window)
    torch.testing.assert_close(probs_attention(probs, values), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", list(TINY_FAMILY_CONFIGS))
def test_profiler_decode_equals_the_reference_forward(variant: str) -> None:
    """The logits of every profiled step equal the reference forward's over the whole
    sequence (prompt + the tokens the profiler chose), windows and scales included."""
    model = tiny_family_model(variant, seed=3)
    f = model.forward
    ids = torch.randint(0, 256, (PROMPT,), generator=torch.Generator().manual_seed(4))
    out = f.forward(ids[:-1])
    seen: list[torch.Tensor] = []
    logits = f.logits

    def spy(hidden: torch.Tensor) -> Any:
        seen.append(logits(hidden)[0])
        return seen[-1][None]

    object.__setattr__(f, "logits", spy)
    try:
        settings = ProfileSettings(budget_pages=1, steps=STEPS, recent_pages=1)
        trace_heads(f, out.keys, out.values, int(ids[-1]), PROMPT - 1, settings)
    finally:
        del f.logits
    chosen = torch.stack([s.argmax() for s in seen[:-1]])
    full = f.forward(torch.cat([ids, chosen])).logits[PROMPT - 1 :]
    assert len(seen) == STEPS
    assert (torch.stack(seen) - full).abs().max().item() <= 1e-4
