from __future__ import annotations

import pytest
import torch

from agentcache.model.rope import RotaryEmbedding
from agentcache.testing import tiny_hf_model
from tests.model.test_forward import ROPES

SHIFTS = [(0, 1), (17, 3), (100, 3900), (5000, 37), (2048, 8000), (7000, 7999)]


def rope_for(name: str) -> RotaryEmbedding:
    hf = tiny_hf_model(rope_parameters=ROPES[name], max_positions=8192)
    return RotaryEmbedding.from_hf_config(hf.config, 16, 8192)


@pytest.mark.parametrize("name", list(ROPES))
def test_rerotated_key_equals_key_encoded_at_new_position(name: str) -> None:
    rope = rope_for(name)
    k = torch.randn(len(SHIFTS), 2, 16, generator=torch.Generator().manual_seed(0))
    old = torch.tensor([a for a, _ in SHIFTS])
    new = torch.tensor([b for _, b in SHIFTS])
    moved = rope.rerotate(rope.apply(k, old), old, new)
    want = rope.apply(k, new)
    rel = (moved - want).norm(dim=(1, 2)) / want.norm(dim=(1, 2))
    assert rel.max().item() <= 1e-5


def test_attention_factor_applied_once() -> None:
    rope = rope_for("yarn")
    assert rope.attention_factor != 1.0
    k = torch.randn(1, 2, 16)
    moved = rope.rerotate(
        rope.apply(k, torch.tensor([10])), torch.tensor([10]), torch.tensor([900])
    )
    assert torch.allclose(moved.norm(), rope.apply(k, torch.tensor([900])).norm(), rtol=1e-5)


def test_naive_fp32_delta_is_worse_at_large_positions() -> None:
    """Why the delta is taken between the model's own fp32 angles: the naive fp32 product
    (p' - p) * inv_freq misses the model's rounding at large positions."""
    rope = rope_for("default")
    old, new = torch.tensor([6000]), torch.tensor([7999])
    k = torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(1))
    want = rope.apply(k, new)
    ours = rope.rerotate(rope.apply(k, old), old, new)
    naive = rope.apply(rope.apply(k, old), new - old) / rope.attention_factor
    assert (ours - want).abs().max() < (naive - want).abs().max()


def test_dynamic_rope_is_refused() -> None:
    from agentcache.errors import ModelLoadError

    hf = tiny_hf_model()
    hf.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ModelLoadError, match="dynamic"):
        RotaryEmbedding.from_hf_config(hf.config, 16)
