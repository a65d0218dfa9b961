from __future__ import annotations

import pytest
import torch

from agentcache.cope.checkpoint import with_adapter
from agentcache.model.cope import CoPEAdapter, CoPEConfig, CoPEForward
from agentcache.model.loading import LoadedModel
from agentcache.reuse import STRATEGIES
from agentcache.reuse.ccpe import CCPEError, chunk_encodings
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_model
from tests.reuse.test_contract import agent_prompt, update_head

ONE = GenerationParams(max_new_tokens=1)
LONG = "memory v2 is much longer than it was before " * 6


def cope_model(max_position: int) -> LoadedModel:
    m = tiny_model()
    adapter = CoPEAdapter.init(m.forward, CoPEConfig(max_position=max_position, rank=2), seed=1)
    g = torch.Generator().manual_seed(2)
    for layer in adapter.layers:  # a trained-looking adapter: nonzero tables and LoRA
        layer.pos_emb.copy_(torch.randn(layer.pos_emb.shape, generator=g) * 0.3)
        for b in layer.lora_b.values():
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    return with_adapter(m, adapter)


def ccpe_engine(model: LoadedModel) -> Engine:
    options = {"cacheslide": {"plan": "ccpe"}}
    return Engine(model, EngineConfig(strategy="cacheslide", strategy_options=options))


def test_ccpe_on_a_rope_model_is_a_clear_error(tiny: LoadedModel) -> None:
    with pytest.raises(CCPEError, match="needs a CoPE model"):
        ccpe_engine(tiny).generate(agent_prompt("memory v1"), ONE)


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_cope_model_nothing_changed_reproduces_full(name: str) -> None:
    model = cope_model(16)
    ref = Engine(model).generate(agent_prompt("memory v1"), ONE, strategy="full")
    engine = Engine(model)
    engine.generate(agent_prompt("memory v1"), ONE, strategy=name)
    again = engine.generate(agent_prompt("memory v1"), ONE, strategy=name)
    assert (again.first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
    assert name == "full" or again.stats.reused_tokens > 0


def test_encodings_match_the_gate_sums() -> None:
    model = cope_model(512)
    f = model.forward
    assert isinstance(f, CoPEForward)
    ids = list(range(40, 100))
    starts = [0, 7, 30, 59]
    hidden = f.embed(torch.tensor(ids))
    q, k, _ = f.project(0, hidden, torch.arange(len(ids)))
    group = f.config.num_heads // f.config.num_kv_heads
    expected = []
    for s in starts:
        per_head = [
            sum(float(torch.sigmoid(q[s, h] @ k[t, h // group] * f.scale)) for t in range(s + 1))
            for h in range(f.config.num_heads)
        ]
        expected.append(round(sum(min(p, 512.0) for p in per_head) / len(per_head)))
    assert chunk_encodings(f, ids, starts) == expected


def test_chunks_reused_at_e_star_and_recomputed_at_another_encoding() -> None:
    model = cope_model(512)  # a cap this high never saturates on these prompts
    engine = ccpe_engine(model)
    engine.generate(agent_prompt("memory v1"), ONE)
    same = engine.generate(agent_prompt("memory v1"), ONE).stats
    assert same.fallbacks == 0 and same.reused_tokens > 0
    moved = engine.generate(agent_prompt(LONG), ONE).stats
    # h1 and h2 sit after the longer update: new encodings, so both are recomputed
    assert moved.fallbacks == 2
    assert all("!= e*" in r for r in moved.fallback_reasons)
    prompt = engine.tokenize(agent_prompt(LONG))
    system = prompt.segments[0]
    # the system prompt, and the update's opening after it (its head: exact)
    head = update_head(engine, "memory v1", LONG)
    assert head > 0 and moved.reused_tokens == len(system.ids) + head


def test_saturated_encodings_keep_reusing_after_a_shift() -> None:
    model = cope_model(4)  # tiny cap: every chunk start sees the prompt start at P
    engine = ccpe_engine(model)
    engine.generate(agent_prompt("memory v1"), ONE)
    moved = engine.generate(agent_prompt(LONG), ONE).stats
    assert moved.fallbacks == 0
    prompt = engine.tokenize(agent_prompt(LONG))
    fixed = sum(len(s.ids) for s in prompt.segments if s.kind in ("system", "fixed"))
    assert moved.reused_tokens == fixed + update_head(engine, "memory v1", LONG)


def test_cope_decode_matches_dense_forward() -> None:
    model = cope_model(16)
    engine = Engine(model)
    gen = engine.generate(agent_prompt("memory v1"), GenerationParams(max_new_tokens=5), "full")
    ids = list(engine.tokenize(agent_prompt("memory v1")).ids)
    for _ in range(5):  # the reference: a dense CoPE forward over everything so far
        ids.append(int(model.forward.forward(torch.tensor(ids)).logits[-1].argmax()))
    assert gen.token_ids == tuple(ids[-5:])
