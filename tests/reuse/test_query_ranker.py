"""The query-aware ranker against its plain formulation: on a turn whose reused KV is exact
and whose window holds every new token, its probe is the full forward of the window, so its
scores are the attention the window pays each token in a dense forward, summed over layers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.ranking.probs import attention_probs_reference
from agentcache.reuse.ranking.query import QueryAttention
from agentcache.runtime import Engine, EngineConfig, GenerationParams

ONE = GenerationParams(max_new_tokens=1)


def prompt(question: str) -> SegmentedPrompt:
    return SegmentedPrompt(
        [
            Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system"),
            Segment(K.FIXED, "Earlier the user asked about trains to Lyon. " * 3, "h1", "user"),
            Segment(K.UPDATE, question, "q", "user"),
        ]
    )


def dense_window_attention(tiny: LoadedModel, ids: Tensor, window: int) -> Tensor:
    """Sum over layers of the attention the last `window` tokens pay each token (max over
    the window, mean over heads), from a plain dense forward. (T,)"""
    f = tiny.forward
    positions = torch.arange(len(ids))
    hidden, score = f.embed(ids), torch.zeros(len(ids))
    for layer in range(f.config.num_layers):
        q, k, v = f.project(layer, hidden, positions)
        probs = attention_probs_reference(q[-window:], positions[-window:], k, f.scale)
        score += probs.mean(dim=0).max(dim=0).values
        hidden = f.attend(layer, hidden, q, k, v, None)
    return score


def test_scores_equal_the_dense_forwards_window_attention(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Tensor, Tensor]] = []
    scores = QueryAttention.scores

    def spy(self: QueryAttention, view: Any) -> Tensor:
        out = scores(self, view)
        seen.append((view.candidates, out))
        return out

    monkeypatch.setattr(QueryAttention, "scores", spy)
    options = {"pic": {"selection": "query", "ratio": 0.3, "probe_window": 128}}
    engine = Engine(tiny, EngineConfig(strategy="pic", strategy_options=options))
    engine.generate(prompt("Which train?"), ONE)  # stores sys and h1, computed in place
    tokens = engine.tokenize(prompt("And which platform does it leave from?"))
    out = engine.generate(tokens, ONE)
    ((candidates, got),) = seen
    new_tokens = tokens.num_tokens - out.stats.reused_tokens
    assert 0 < new_tokens <= 128  # the window holds every new token
    want = dense_window_attention(tiny, torch.tensor(tokens.ids), new_tokens)[candidates]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(candidates) == out.stats.reused_tokens  # nothing exact: exact_prefix is off


def test_the_probe_writes_nothing_and_counts_its_token_layers(tiny: LoadedModel) -> None:
    """With a zero budget the prefill is pic's plus the probe: the same K/V and logits as pic,
    and the window's token-layers on top."""
    prefills = {}
    for name, options in (("pic", {}), ("query", {"selection": "query", "probe_window": 8})):
        engine = Engine(tiny, EngineConfig(strategy="pic", strategy_options={"pic": options}))
        engine.generate(prompt("Which train?"), ONE)
        seq, pre = engine.prefill(engine.tokenize(prompt("A much longer question " * 3)))
        prefills[name] = (pre, seq.gather_all(slice(0, seq.num_tokens)))
        seq.free()
    (pic, pic_kv), (query, query_kv) = prefills["pic"], prefills["query"]
    assert torch.equal(query.logits, pic.logits)
    assert all(torch.equal(a, b) for a, b in zip(query_kv, pic_kv, strict=True))
    extra = (query.stats.recompute_fraction - pic.stats.recompute_fraction) * (
        pic.stats.prompt_tokens * tiny.config.num_layers
    )
    assert extra == pytest.approx(8 * tiny.config.num_layers)
