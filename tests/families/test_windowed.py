"""A sliding-window layer's reused KV outside every window: neither loaded nor counted, the
prefill unchanged, and never stored as a segment's KV."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from agentcache.model.loading import LoadedModel
from agentcache.reuse import STRATEGIES
from agentcache.reuse.base import PrefillResult
from agentcache.reuse.selective import SelectiveRecompute
from agentcache.reuse.windowed import within_window
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_family_model
from tests.reuse.test_contract import agent_prompt

SELECTIVE = [n for n in STRATEGIES.names() if issubclass(STRATEGIES.get(n), SelectiveRecompute)]
PARAMS = GenerationParams(max_new_tokens=4)


@pytest.mark.parametrize("window", [1, 3, 24, 100])
def test_within_window_is_the_plain_definition(window: int) -> None:
    g = torch.Generator().manual_seed(window)
    reach = torch.rand(60, generator=g) < 0.1
    reach[-1] = True
    want = torch.tensor([bool(reach[j : j + window].any()) for j in range(60)])
    assert torch.equal(within_window(reach, window), want)


@pytest.fixture(scope="module")
def mistral() -> LoadedModel:
    return tiny_family_model("mistral", seed=3)  # every layer slides, W = 24


def _turns(
    model: LoadedModel, name: str, skip: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[PrefillResult, Tensor | None]:
    monkeypatch.setattr(SelectiveRecompute, "skip_window_loads", skip)
    engine = Engine(model, EngineConfig(cost_guard=False))  # every plan runs as planned
    engine.generate(agent_prompt("memory v1"), PARAMS, strategy=name)
    tokens = engine.tokenize(agent_prompt("memory v2, longer now"))
    seq, pre = engine.prefill(tokens, name)
    holes = seq.holes
    engine.commit(tokens, seq, pre, name)
    seq.free()
    return pre, holes


@pytest.mark.parametrize("name", SELECTIVE)
def test_skipping_rows_outside_every_window_changes_nothing_but_the_load(
    mistral: LoadedModel, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, no_holes = _turns(mistral, name, False, monkeypatch)
    got, holes = _turns(mistral, name, True, monkeypatch)
    assert no_holes is None
    assert torch.equal(got.logits, ref.logits)
    assert torch.equal(got.positions, ref.positions)
    assert got.stats.reused_tokens == ref.stats.reused_tokens
    o = STRATEGIES.get(name)().options  # type: ignore[attr-defined]
    if o.evidence_pass == "check" and not o.exact_prefix:  # its pass runs every token below
        assert holes is None and got.stats.loaded_tokens == ref.stats.loaded_tokens
        return
    assert holes is not None and bool(holes.any())  # the 50-token segments pass W = 24
    assert got.stats.loaded_tokens < ref.stats.loaded_tokens


def test_a_segment_with_holes_is_not_stored(
    mistral: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed after its stored copy went: the sequence lacks K/V for some of its tokens at
    the sliding layers, so the segment is not stored from it (the next turn computes it)."""
    monkeypatch.setattr(SelectiveRecompute, "skip_window_loads", True)
    engine = Engine(mistral, EngineConfig(cost_guard=False))
    engine.generate(agent_prompt("memory v1"), PARAMS, strategy="pic")
    tokens = engine.tokenize(agent_prompt("memory v2, longer now"))
    seq, pre = engine.prefill(tokens, "pic")
    assert seq.holes is not None
    holed = [s for s in tokens.segments if bool(seq.holes[s.start : s.end].any())]
    assert holed
    engine.store.clear()
    engine.commit(tokens, seq, pre, "pic")
    seq.free()
    m = mistral
    for s in tokens.segments:
        found = engine.store.lookup(m.model_id, m.tokenizer.tokenizer_id, s.ids, "segment")
        assert (found.kv is None) == (s in holed), s.segment.id
