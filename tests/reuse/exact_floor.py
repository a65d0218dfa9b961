"""The planner's exact floor on a store earlier turns filled: its output is full recompute's."""

from __future__ import annotations

from agentcache.kv.store import SegmentStore
from agentcache.model.loading import LoadedModel
from agentcache.prompt import SegmentedPrompt
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from agentcache.runtime.stats import Generation


def exact_floor_output(
    tiny: LoadedModel, store: SegmentStore, prompt: SegmentedPrompt, params: GenerationParams
) -> Generation:
    """`prompt` under `plan` at `fidelity=exact` on `store`, checked against `full` on a fresh
    engine: the same tokens, first-token logits within rounding."""
    exact = EngineConfig(strategy="plan", strategy_options={"plan": {"fidelity": "exact"}})
    out = Engine(tiny, exact, store=store).generate(prompt, params)
    ref = Engine(tiny).generate(prompt, params, strategy="full")
    assert out.token_ids == ref.token_ids
    assert (out.first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
    return out
