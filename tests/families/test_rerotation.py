"""Re-rotation through the engine, per family: after an earlier segment changed length, a
moved segment's first-layer keys (which depend on token and position alone) equal the keys
the model computes at its new positions, each layer moved by its own rotary (Gemma 3's local
base on its sliding layers, a NoPE layer's keys as stored, a partial rotary's share only)."""

from __future__ import annotations

import pytest
import torch

from agentcache.model.loading import from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_family_hf_model
from tests.reuse.test_contract import agent_prompt

VARIANTS = {
    "gemma3": {},  # layer 0 slides, rotated with the local base
    "smollm3-nope-first": {"no_rope_layers": [0, 1, 1, 1]},  # layer 0 is NoPE
    "phi3": {},  # half of each head's dims rotate
    "qwen3": {},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moved_first_layer_keys_equal_keys_computed_at_the_new_positions(variant: str) -> None:
    hf = tiny_family_hf_model(variant.split("-")[0], seed=5, **VARIANTS[variant])
    model = from_hf(hf, ByteTokenizer(), variant)
    engine = Engine(model, EngineConfig(cost_guard=False))
    first = engine.tokenize(agent_prompt("memory v1"))
    engine.generate(first, GenerationParams(max_new_tokens=1), strategy="pic")
    tokens = engine.tokenize(agent_prompt("memory v2, longer now"))
    seq, pre = engine.prefill(tokens, "pic")
    try:
        t = tokens.num_tokens
        keys = seq.gather_all(slice(0, t))[0][0]  # layer 0 (T, Hkv, Dh)
        loaded = pre.stats.reused
        assert loaded is not None
        if seq.holes is not None:
            loaded = loaded & ~seq.holes
    finally:
        seq.free()
    ids = torch.tensor(tokens.ids)
    want = model.forward.forward(ids, pre.positions).keys[0]
    moved = loaded & (pre.positions != _stored_positions(first, tokens))
    assert int(moved.sum()) > 20  # the history segments moved with the longer update
    diff = (keys[moved] - want[moved]).abs().max().item()
    assert diff <= 1e-4 * want.abs().max().item()


def _stored_positions(first: TokenizedPrompt, now: TokenizedPrompt) -> torch.Tensor:
    """Each token's position in the first turn, by segment (a segment keeps its offsets)."""
    before = {s.segment.id: s.start for s in first.segments}
    out = torch.full((now.num_tokens,), -1)
    for s in now.segments:
        if s.segment.id in before:
            out[s.start : s.end] = torch.arange(len(s.ids)) + before[s.segment.id]
    return out
