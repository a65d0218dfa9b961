from __future__ import annotations

import pytest
import torch

from agentcache.model.loading import from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.testing import tiny_hf_model

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    },
}


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_logits_match_transformers(model_type: str, rope: str) -> None:
    hf = tiny_hf_model(model_type, seed=1, rope_parameters=ROPES[rope])
    ours = from_hf(hf, ByteTokenizer(), "tiny")
    ids = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(2))
    want = hf(ids[None]).logits[0]
    got = ours.forward.forward(ids).logits
    assert (got - want).abs().max().item() <= 1e-4


def test_layer_api_subset_matches_full(tiny) -> None:  # type: ignore[no-untyped-def]
    """Computing only the last 5 tokens against supplied K/V equals the dense forward."""
    f = tiny.forward
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3))
    ref = f.forward(ids)
    pos = torch.arange(40)
    hidden = f.embed(ids[35:])
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, pos[35:])
        keys = torch.cat([ref.keys[layer, :35], k])
        values = torch.cat([ref.values[layer, :35], v])
        hidden = f.attend(layer, hidden, q, keys, values, pos[35:])
    assert torch.allclose(f.logits(hidden), ref.logits[35:], atol=1e-5)
