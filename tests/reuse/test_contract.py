"""The contract every registered strategy keeps (reuse/base.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import Tensor

from agentcache.kv.store import MissReason
from agentcache.model.loading import LoadedModel, from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse import STRATEGIES
from agentcache.runtime import Engine, GenerationParams
from agentcache.testing import tiny_hf_model, tiny_model

PARAMS = GenerationParams(max_new_tokens=6)
ONE = GenerationParams(max_new_tokens=1)


def agent_prompt(update: str) -> SegmentedPrompt:
    return SegmentedPrompt(
        [
            Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system"),
            Segment(K.UPDATE, update, "memory", "user"),
            Segment(K.FIXED, "Earlier the user asked about trains to Lyon. " * 3, "h1", "user"),
            Segment(K.FIXED, "Reflection: check the timetable first. " * 3, "h2", "assistant"),
            Segment(K.UPDATE, "Now answer the new question:", "obs", "user"),
        ]
    )


def update_head(engine: Engine, before: str, after: str) -> int:
    """Tokens `agent_prompt(after)`'s update shares from its start with `agent_prompt(before)`'s:
    after the unchanged system prompt, its head (an exact run, reuse/segments.py)."""
    a = engine.tokenize(agent_prompt(before)).segments[1].ids
    b = engine.tokenize(agent_prompt(after)).segments[1].ids
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_nothing_changed_reproduces_full(tiny: LoadedModel, name: str) -> None:
    ref = Engine(tiny).generate(agent_prompt("memory v1"), PARAMS, strategy="full")
    engine = Engine(tiny)
    engine.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    again = engine.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    assert again.token_ids == ref.token_ids
    assert (again.first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
    if name != "full":
        assert again.stats.reused_tokens > 0


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_changed_update_runs_and_reports(tiny: LoadedModel, name: str) -> None:
    engine = Engine(tiny)
    engine.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    out = engine.generate(agent_prompt("memory v2, now much longer: " * 6), PARAMS, strategy=name)
    s = out.stats
    assert s.strategy == name
    assert 0 <= s.reused_tokens < s.prompt_tokens
    assert 0 < s.recompute_fraction <= 1.0 + 1e-9
    assert s.recomputed_tokens >= 1  # the last token is always computed
    assert s.reused_tokens + s.recomputed_tokens >= s.prompt_tokens or name == "pic"
    assert len(out.token_ids) == PARAMS.max_new_tokens or out.finish_reason == "stop"


class OtherTokenizer(ByteTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.tokenizer_id = "bytes-other"


@pytest.mark.parametrize("name", [n for n in STRATEGIES.names() if n != "full"])
@pytest.mark.parametrize("other", ["model", "tokenizer"])
def test_never_serves_another_models_segments(tiny: LoadedModel, name: str, other: str) -> None:
    first = Engine(tiny)
    first.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    if other == "model":
        model = from_hf(tiny_hf_model(seed=7), ByteTokenizer(), "tiny-llama")
    else:
        model = from_hf(tiny_hf_model(seed=0), OtherTokenizer(), "tiny-llama")
    second = Engine(model, store=first.store)  # one store shared by two engines
    out = second.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    ref = Engine(model).generate(agent_prompt("memory v1"), PARAMS, strategy="full")
    assert out.stats.reused_tokens == 0
    assert torch.allclose(out.first_token_logits, ref.first_token_logits, atol=1e-5)
    reasons = {m.reason for m in out.stats.misses}
    assert reasons <= {MissReason.OTHER_MODEL, MissReason.NEW}
    if name not in ("prefix",):
        assert MissReason.OTHER_MODEL in reasons


def test_default_strategy_is_registered() -> None:
    from agentcache.reuse import DEFAULT_STRATEGY
    from agentcache.runtime import EngineConfig

    assert EngineConfig().strategy == DEFAULT_STRATEGY
    assert DEFAULT_STRATEGY in STRATEGIES.names()


def test_tiny_fixture_is_deterministic() -> None:
    a, b = tiny_model(), tiny_model()
    assert a.model_id == b.model_id


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_a_cold_turn_computes_what_full_computes(
    tiny: LoadedModel, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to reuse yet: the same model calls as `full` (a plain causal prefill: no probe,
    no check layer, no masked subset attention), the same logits, no fallback counted."""
    calls: list[tuple[int, int, bool]] = []
    attend = tiny.forward.attend

    def spy(layer: int, hidden: Tensor, q: Tensor, k: Tensor, v: Tensor, idx: Any) -> Tensor:
        calls.append((layer, len(hidden), idx is None))
        return attend(layer, hidden, q, k, v, idx)

    monkeypatch.setattr(tiny.forward, "attend", spy)
    ref = Engine(tiny).generate(agent_prompt("memory v1"), ONE, strategy="full")
    full_calls, calls[:] = list(calls), []
    out = Engine(tiny).generate(agent_prompt("memory v1"), ONE, strategy=name)
    assert calls == full_calls
    assert out.stats.recompute_fraction == ref.stats.recompute_fraction == 1.0
    assert out.stats.recomputed_tokens == ref.stats.recomputed_tokens
    assert out.stats.fallbacks == 0 and not out.stats.probe_skipped
    assert torch.equal(out.first_token_logits, ref.first_token_logits)
    assert out.token_ids == ref.token_ids


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_overhead_is_the_prefill_time_not_spent_computing(tiny: LoadedModel, name: str) -> None:
    engine = Engine(tiny)
    engine.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    tokens = engine.tokenize(agent_prompt("memory v2, now much longer: " * 6))
    t0 = time.perf_counter()
    seq, pre = engine.prefill(tokens, name)
    wall = time.perf_counter() - t0
    seq.free()
    s = pre.stats
    assert s.compute_s > 0.0 and s.overhead_s > 0.0
    assert s.compute_s + s.overhead_s <= wall  # the prefill's own time, split in two


def scoped_prompt(scope: str) -> SegmentedPrompt:
    segs = agent_prompt("memory v1").segments
    return SegmentedPrompt([Segment(s.kind, s.text, s.id, s.role, scope) for s in segs])


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_another_scope_reuses_nothing(tiny: LoadedModel, name: str) -> None:
    """Scoped KV (the server's tenants and conversations) is never served to another scope,
    even for identical tokens; the same scope reuses it."""
    engine = Engine(tiny)
    engine.generate(scoped_prompt("tenant-a"), ONE, strategy=name)
    other = engine.generate(scoped_prompt("tenant-b"), ONE, strategy=name)
    same = engine.generate(scoped_prompt("tenant-a"), ONE, strategy=name)
    assert other.stats.reused_tokens == 0
    assert name == "full" or same.stats.reused_tokens > 0
