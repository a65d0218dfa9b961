"""The contract every registered token ranker keeps (reuse/ranking/base.py), run through a
real prefill on the tiny model: it spends its budget on candidates only, the same seed gives
the same prefill, `up_front` rankers compute what `select_up_front` says before any layer
runs, a budget covering every candidate is full recompute, and a pass it cannot read is a
clear error."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.reuse import StrategySpec
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.ranking import RANKERS
from agentcache.reuse.runs import reused_runs
from agentcache.reuse.segments import find_hits
from agentcache.reuse.upfront import select_up_front
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from tests.reuse.test_contract import agent_prompt

ONE = GenerationParams(max_new_tokens=1)
SHIFTED = "memory v2 is longer than before " * 5
PASS_OPTIONS: dict[str, dict[str, Any]] = {
    "check": {"check_layer": 1},
    "probe": {"probe_layers": 2, "probe_shortcut": False},
    "own": {},
}


def ranker_options(name: str, ratio: float, **extra: Any) -> dict[str, Any]:
    """pic's settings, ranking with `name` in the first pass it can read."""
    passes = RANKERS.get(name).passes()
    options = {"selection": name, "ratio": ratio, "exact_prefix": True, "seed": 3}
    return options | (PASS_OPTIONS[passes[0]] if passes else {}) | extra


def second_turn(tiny: LoadedModel, options: dict[str, Any]) -> tuple[Engine, Any]:
    engine = Engine(tiny, EngineConfig(strategy="pic", strategy_options={"pic": options}))
    engine.generate(agent_prompt("memory v1"), ONE)
    seq, pre = engine.prefill(engine.tokenize(agent_prompt(SHIFTED)))
    seq.free()
    return engine, pre


def up_front_selection(engine: Engine, options: dict[str, Any]) -> Any:
    prompt = engine.tokenize(agent_prompt(SHIFTED))
    hits = find_hits(engine.ctx, prompt, ReuseStats(prompt.num_tokens, 1))
    o = SelectiveOptions(**options)
    runs = reused_runs(prompt, hits, torch.arange(prompt.num_tokens), o)
    return select_up_front(o, prompt.num_tokens, runs)


@pytest.mark.parametrize("name", RANKERS.names())
@pytest.mark.parametrize("ratio", [0.1, 0.4])
def test_spends_its_budget_on_candidates_only(tiny: LoadedModel, name: str, ratio: float) -> None:
    engine, pre = second_turn(tiny, ranker_options(name, ratio))
    sel = up_front_selection(engine, ranker_options(name, ratio))
    candidates = sel.reused & ~sel.exact
    n = int(candidates.sum())
    assert 0 < n < int(sel.reused.sum())  # the system prompt is an exact prefix
    assert pre.stats.dirty is not None
    picked = pre.stats.dirty & sel.reused  # reused tokens computed at layers >= 1
    assert int(picked.sum()) == math.ceil(ratio * n)
    assert not bool((picked & ~candidates).any())  # never an exact token, never outside


@pytest.mark.parametrize("name", RANKERS.names())
def test_the_same_seed_gives_the_same_prefill(tiny: LoadedModel, name: str) -> None:
    (_, a), (_, b) = (second_turn(tiny, ranker_options(name, 0.3)) for _ in range(2))
    assert torch.equal(a.logits, b.logits)
    assert a.stats.dirty is not None and b.stats.dirty is not None
    assert torch.equal(a.stats.dirty, b.stats.dirty)


@pytest.mark.parametrize("name", RANKERS.names())
def test_up_front_rankers_compute_what_select_up_front_says(tiny: LoadedModel, name: str) -> None:
    ranker = RANKERS.get(name)
    options = ranker_options(name, 0.3)
    engine, pre = second_turn(tiny, options)
    sel = up_front_selection(engine, options)
    assert engine.strategy("pic").up_front == ranker.up_front
    if ranker.up_front:
        assert not ranker.reads and ranker.passes() == ()
        assert pre.stats.recomputed_tokens == int(sel.base.sum())
        assert torch.equal(pre.stats.dirty, sel.base & sel.reused)
    else:  # picks are made after a pass: up front there is only the base
        assert ranker.passes()
        assert not bool((sel.base & sel.candidates).any())


@pytest.mark.parametrize("name", RANKERS.names())
def test_a_budget_covering_every_candidate_is_full_recompute(tiny: LoadedModel, name: str) -> None:
    ref = Engine(tiny).generate(agent_prompt(SHIFTED), ONE, strategy="full")
    _, pre = second_turn(tiny, ranker_options(name, 1.0))
    torch.testing.assert_close(pre.logits, ref.first_token_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", RANKERS.names())
def test_a_pass_the_ranker_cannot_read_is_named(name: str) -> None:
    ranker = RANKERS.get(name)
    for run, options in PASS_OPTIONS.items():
        if ranker.up_front or run in ranker.passes() or run == "own":
            continue
        with pytest.raises(ConfigError, match=f"selection={name} cannot rank in the {run} pass"):
            StrategySpec.parse(f"pic:selection={name}:ratio=0.2:" + _spec(options))


def _spec(options: dict[str, Any]) -> str:
    return ":".join(f"{k}={str(v).lower()}" for k, v in options.items())
