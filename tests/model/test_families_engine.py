"""Every family through the engine: the position-keeping strategies run it (a second turn's
prefix reused gives full recompute's tokens), so do the strategies that move cached keys (each
layer by its own rotary, sliding windows honoured), and a family that declares it cannot serve
them is refused at configuration."""

from __future__ import annotations

import pytest

from agentcache.errors import ConfigError
from agentcache.model.families.base import SEGMENT_REUSE, Structure
from agentcache.model.families.llama import LlamaFamily
from agentcache.model.loading import from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import TINY_FAMILY_CONFIGS, tiny_family_hf_model

SYSTEM = "You are a careful agent. Think before acting, then act. " * 2


def _prompt(turn: str) -> SegmentedPrompt:
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, SYSTEM), Segment(SegmentKind.UPDATE, turn)])


@pytest.mark.parametrize("variant", list(TINY_FAMILY_CONFIGS))
def test_prefix_reuse_gives_full_recomputes_tokens(variant: str) -> None:
    model = from_hf(tiny_family_hf_model(variant, seed=7), ByteTokenizer(), variant)
    params = GenerationParams(max_new_tokens=12)
    full = Engine(model, EngineConfig(strategy="full"))
    prefix = Engine(model, EngineConfig(strategy="prefix"))
    for turn in ("first observation", "second observation, longer than the first"):
        want = full.generate(_prompt(turn), params)
        got = prefix.generate(_prompt(turn), params)
        assert got.token_ids == want.token_ids
    assert got.stats.reused_tokens > 0


class NoSegmentReuse(LlamaFamily):
    """A family that declares segment reuse beyond it (as one with, say, a rotary that
    cannot be moved would)."""

    def limits(self, s: Structure) -> dict[str, str]:
        return {**super().limits(s), SEGMENT_REUSE: "its keys cannot be moved"}


def test_key_moving_strategies_are_refused_where_the_family_says_so() -> None:
    model = from_hf(tiny_family_hf_model("llama3"), ByteTokenizer(), "llama3")
    object.__setattr__(model.forward, "family", NoSegmentReuse())
    with pytest.raises(ConfigError, match=r"llama family .* strategy 'pic'"):
        Engine(model, EngineConfig(strategy="pic"))
    engine = Engine(model, EngineConfig(strategy="prefix"))
    with pytest.raises(ConfigError, match=r"llama family .* strategy 'epic'.*cannot be moved"):
        engine.strategy("epic")


@pytest.mark.parametrize("variant", list(TINY_FAMILY_CONFIGS))
@pytest.mark.parametrize("strategy", ["pic", "epic", "cacheblend", "cacheslide", "rpdc"])
def test_families_with_segment_reuse_reuse_an_unchanged_prompt_exactly(
    variant: str, strategy: str
) -> None:
    """Reuse with nothing changed equals full recompute, on every family serving it."""
    model = from_hf(tiny_family_hf_model(variant, seed=9), ByteTokenizer(), variant)
    params = GenerationParams(max_new_tokens=8)
    prompt = SegmentedPrompt(
        [
            Segment(SegmentKind.SYSTEM, SYSTEM),
            Segment(SegmentKind.FIXED, "a reflection kept across turns", "r1"),
            Segment(SegmentKind.UPDATE, "the latest observation"),
        ]
    )
    want = Engine(model, EngineConfig(strategy="full")).generate(prompt, params, commit=False)
    engine = Engine(model, EngineConfig(strategy=strategy))
    engine.generate(prompt, params)
    got = engine.generate(prompt, params)
    assert got.stats.reused_tokens > 0
    assert got.token_ids == want.token_ids
