"""agentcache.bench.server.at_once: turns with_cpu_time together on one engine."""

from __future__ import annotations

import pytest

from agentcache.bench.server.at_once import generate_at_once, with_cpu_time
from agentcache.errors import AgentCacheError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams


def prompts(n: int) -> list[SegmentedPrompt]:
    return [SegmentedPrompt([Segment(SegmentKind.SYSTEM, "a shared preamble " * 4),
                             Segment(SegmentKind.UPDATE, f"question {i} " * (i + 1))])
            for i in range(n)]  # fmt: skip


def test_every_turn_runs_at_once_and_gets_its_reply_alone(tiny: LoadedModel) -> None:
    e = Engine(tiny, EngineConfig(kv_pages=256, batch_decode=True))
    params = GenerationParams(max_new_tokens=6)
    alone = [e.generate(p, params, "full", commit=False).token_ids for p in prompts(3)]
    got, cpu = with_cpu_time(lambda: generate_at_once(e, prompts(3), params, "full"))
    assert [g.token_ids for g in got.generations] == alone
    assert len(got.ttft_s) == 3 and all(0 < t <= got.wall_s for t in got.ttft_s)
    assert cpu > 0
    assert e.gate.peak_running == 3  # admitted together


def test_a_turn_that_raises_raises_in_the_caller(tiny: LoadedModel) -> None:
    """A turn whose generate raised on its thread fails the run with its error, rather than
    returning fewer generations than prompts."""
    e = Engine(tiny, EngineConfig(kv_pages=256, batch_decode=True))
    with pytest.raises(AgentCacheError, match="no-such-strategy"):
        generate_at_once(e, prompts(2), GenerationParams(max_new_tokens=2), "no-such-strategy")
