"""The bench's key deviation (`cksim_by_layer`) on sliding-window families: a strategy that
leaves a window layer's unread rows unloaded (reuse/windowed.py) is scored on the keys later
tokens read, and the `transformers-prefix` peer, whose cache cannot crop a window, is refused."""

from __future__ import annotations

import pytest
import torch

from agentcache.bench.peer import TransformersPrefix
from agentcache.bench.reuse.harness import BenchRunner, parse_specs
from agentcache.bench.reuse.metrics import cksim_by_layer
from agentcache.errors import ConfigError
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_family_hf_model
from tests.families.declared import model
from tests.reuse.test_contract import agent_prompt


def test_only_the_rows_later_tokens_read_count_on_a_window_layer() -> None:
    ref = torch.randn(2, 10, 2, 4)
    keys = ref.clone()
    keys[:, :6] = torch.randn(2, 6, 2, 4)  # rows 0..5 differ; the last 4 agree
    glob, win = cksim_by_layer(ref, keys, [None, 5])
    assert glob < 0.9 and win == pytest.approx(1.0)
    assert cksim_by_layer(ref, keys, [None, 8])[1] < 0.9  # a window reaching row 3 sees it
    with pytest.raises(ValueError, match="3 layer windows for keys of 2 layers"):
        cksim_by_layer(ref, keys, [None, 5, 5])


@pytest.mark.parametrize("strategy", ["epic", "pic"])
def test_exact_reuse_with_unloaded_window_rows_scores_one(strategy: str) -> None:
    """Nothing changed: the strategy's KV is full's wherever a query reads it. Its sequence
    holds no K/V for rows no window reaches, which the bench must not score."""
    m = model("mistral", seed=3)
    runner = BenchRunner(m, parse_specs(f"full,{strategy}"))
    assert runner.windows == [24] * 4
    engine, full = Engine(m, EngineConfig(strategy=strategy)), Engine(m)
    engine.generate(agent_prompt("memory v1"), GenerationParams(max_new_tokens=2))
    prompt = engine.tokenize(agent_prompt("memory v1"))
    seq, _ = engine.prefill(prompt, strategy)
    ref_seq, _ = full.prefill(prompt, "full")
    try:
        assert seq.holes is not None and bool(seq.holes.any())  # rows left unloaded
        keys = seq.gather_all(slice(0, prompt.num_tokens))[0]
        ref = ref_seq.gather_all(slice(0, prompt.num_tokens))[0]
        assert cksim_by_layer(ref, keys, runner.windows) == pytest.approx([1.0] * 4)
        assert min(cksim_by_layer(ref, keys)) < 0.9  # every row counted: the holes too
    finally:
        seq.free()
        ref_seq.free()


@pytest.mark.parametrize("variant", ["mistral", "gemma3", "qwen2-window"])
def test_the_transformers_prefix_peer_refuses_window_layers(variant: str) -> None:
    hf = tiny_family_hf_model(variant)
    with pytest.raises(ConfigError, match=r"transformers-prefix .*sliding-window"):
        TransformersPrefix(hf)
    TransformersPrefix(tiny_family_hf_model("qwen2"))  # no window: runs
