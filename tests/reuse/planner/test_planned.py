"""The `plan` strategy on the tiny random model: exact is full, choices are reported, a turn
that cannot be predicted runs exact and is counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.reuse.planner import PlannedReuse, PlannedStats, Predictor, plan_fields
from agentcache.runtime import Engine, EngineConfig, GenerationParams
from tests.reuse.planner.conftest import predictor_for
from tests.reuse.test_contract import agent_prompt

PARAMS = GenerationParams(max_new_tokens=6)
UPDATES = ("memory v1", "memory v2, now much longer: " * 6, "v3", "memory v4 " * 3)


def engine(tiny: LoadedModel, **options: object) -> Engine:
    config = EngineConfig(strategy="plan", strategy_options={"plan": options})
    return Engine(tiny, config)


def test_exact_gives_full_recomputes_outputs(tiny: LoadedModel) -> None:
    planned, full = engine(tiny, fidelity="exact"), Engine(tiny)
    for update in UPDATES:
        ref = full.generate(agent_prompt(update), PARAMS, strategy="full")
        out = planned.generate(agent_prompt(update), PARAMS)
        assert out.token_ids == ref.token_ids
        assert (out.first_token_logits - ref.first_token_logits).abs().max().item() <= 1e-4
        assert out.stats.fallbacks == 0
    assert out.stats.reused_tokens > 0  # exact by computing what changed, not everything


def _prefill(e: Engine, update: str) -> PlannedStats:
    """A prefill and commit through the engine's strategy; its planned stats."""
    prompt = e.tokenize(agent_prompt(update))
    strat = e.strategy()
    seq = SequenceKV(e.ctx.pool)
    try:
        with torch.inference_mode():
            pre = strat.prefill(e.ctx, prompt, seq)
            strat.commit(e.ctx, prompt, seq, pre.positions)
    finally:
        seq.free()
    assert isinstance(pre.stats, PlannedStats)
    return pre.stats


def test_without_a_predictor_a_warm_turn_runs_exact_and_counts_it(tiny: LoadedModel) -> None:
    e = engine(tiny)  # fidelity=high, and no predictor ships for the tiny model
    cold = _prefill(e, UPDATES[0])
    assert cold.fallbacks == 0  # nothing stored: nothing to predict
    warm = _prefill(e, UPDATES[1])
    assert warm.fallbacks == 1
    assert "no plan predictor for model tiny-llama" in warm.fallback_reasons[0]
    assert warm.plan is not None and warm.plan.chosen.exact
    assert plan_fields(warm)["plan_unpredicted"] == warm.plan.unpredicted


def test_a_segment_stored_by_another_strategy_runs_exact_and_counts_it(
    tiny: LoadedModel, tmp_path: Path, tiny_predictor: Predictor
) -> None:
    path = tmp_path / "p.json"
    tiny_predictor.save(path)
    other = Engine(tiny)
    other.generate(agent_prompt(UPDATES[0]), PARAMS, strategy="rpdc")
    config = EngineConfig(strategy="plan", strategy_options={"plan": {"predictor": str(path)}})
    shared = Engine(tiny, config, store=other.store)
    stats = _prefill(shared, UPDATES[1])
    assert stats.fallbacks == 1 and "stored by another" in stats.fallback_reasons[0]
    assert stats.plan is not None and stats.plan.chosen.exact


def test_a_permissive_floor_takes_the_cheapest_plan_and_says_why(
    tiny: LoadedModel, tmp_path: Path, tiny_predictor: Predictor
) -> None:
    path = tmp_path / "p.json"
    tiny_predictor.save(path)  # every approximate plan predicts KL 1e-5
    e = engine(tiny, predictor=str(path), fidelity="balanced")
    _prefill(e, UPDATES[0])
    stats = _prefill(e, UPDATES[1])
    assert stats.plan is not None
    assert stats.plan.plan == "pic"  # computes the least: only update tokens and the last
    fields = plan_fields(stats)
    assert fields["plan"] == "pic" and fields["plan_floor"] == "balanced"
    assert fields["predicted_tf_kl"] == pytest.approx(1e-5 - 1e-7)
    costs = {k: v["cost"] for k, v in fields["plans_considered"].items()}
    assert costs["pic"] == min(costs.values())
    assert costs["probe"] > costs["pic"]  # the probe pass is counted in its plan's cost
    assert stats.overhead_s >= 0 and fields["planning_ms"] > 0


def test_a_strict_floor_keeps_the_turn_exact(tiny: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    predictor_for(tiny.model_id, kl_log10=-2.0).save(path)  # every plan predicts 1e-2
    e = engine(tiny, predictor=str(path))  # high: bounds 1e-4
    _prefill(e, UPDATES[0])
    stats = _prefill(e, UPDATES[1])
    assert stats.plan is not None and stats.plan.chosen.exact and stats.fallbacks == 0


def test_another_models_predictor_fails_before_model_work(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    path = tmp_path / "p.json"
    predictor_for("smollm2").save(path)
    e = engine(tiny, predictor=str(path))
    seq = SequenceKV(e.ctx.pool)
    with pytest.raises(ConfigError, match="fitted on model 'smollm2', not 'tiny-llama#"):
        e.strategy().prefill(e.ctx, e.tokenize(agent_prompt("x")), seq)
    assert seq.num_tokens == 0  # nothing was allocated or computed


def test_options_from_python_are_checked() -> None:
    with pytest.raises(ConfigError, match="fidelity must be one of"):
        PlannedReuse(fidelity="perfect")


def test_commit_stores_what_every_plan_reads(tiny: LoadedModel) -> None:
    """After a turn, the next one's `prefix` plan finds its blocks and the selective plans
    their segments: the estimates say so before any model call."""
    e = engine(tiny, fidelity="exact")
    _prefill(e, UPDATES[0])
    stats = _prefill(e, UPDATES[0])  # nothing changed
    assert stats.plan is not None
    considered = {x.plan: x for x in stats.plan.considered}
    full_cost = considered["full"].cost
    assert considered["prefix"].cost < full_cost and considered["exact"].cost < full_cost
    assert all(x.exact for x in considered.values())  # nothing changed: every plan is exact


def test_turn_stats_name_the_plan_its_predictions_and_any_fallback(
    tiny: LoadedModel, tmp_path: Path, tiny_predictor: Predictor
) -> None:
    path = tmp_path / "p.json"
    tiny_predictor.save(path)
    e = engine(tiny, predictor=str(path), fidelity="balanced")
    e.generate(agent_prompt(UPDATES[0]), PARAMS)
    stats = e.generate(agent_prompt(UPDATES[1]), PARAMS).stats
    assert stats.strategy == "plan" and stats.plan is not None
    assert stats.plan.plan == "pic" and stats.plan.floor == "balanced"
    assert stats.plan.chosen.tf_kl == pytest.approx(1e-5 - 1e-7)
    assert stats.plan.chosen.cost == min(x.cost for x in stats.plan.considered)
    assert stats.plan.unpredicted is None and stats.fallbacks == 0

    unpredicted = engine(tiny)  # no predictor ships for the tiny model: exact, counted
    unpredicted.generate(agent_prompt(UPDATES[0]), PARAMS)
    stats = unpredicted.generate(agent_prompt(UPDATES[1]), PARAMS).stats
    assert stats.plan is not None and stats.plan.chosen.exact
    assert stats.plan.unpredicted is not None and stats.fallbacks == 1
    assert stats.fallback_reasons[0].startswith("plan: no plan predictor for model")

    other = Engine(tiny).generate(agent_prompt(UPDATES[0]), PARAMS, strategy="rpdc")
    assert other.stats.plan is None


@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("plan", ["exact", "prefix", "epic", "pic", "probe", "probe5"])
def test_a_plans_cost_is_the_work_its_own_guard_counts(
    tiny: LoadedModel, tmp_path: Path, tiny_predictor: Predictor, plan: str, heads: bool
) -> None:
    """The planner's cost of a plan, read before any layer runs, is what the plan's strategy
    then counts for its cost guard (`ReuseStats.guard`: its work over full's), with the
    openings of changed segments (`update_heads`) found by the strategy or not."""
    path = tmp_path / "p.json"
    tiny_predictor.save(path)  # every approximate plan predicts KL 1e-5: under `balanced`
    e = engine(tiny, predictor=str(path), fidelity="balanced", plans=f"{plan}+full", min_gain=0.0)
    e.ctx = replace(e.ctx, update_heads=heads)
    _prefill(e, UPDATES[0])  # nothing stored yet: no plan beside full's, no guard
    found = 0
    for update in UPDATES[1:]:
        stats = _prefill(e, update)
        assert stats.plan is not None and stats.plan.plan == plan
        assert stats.guard is not None and stats.guard.taken
        assert stats.plan.chosen.cost == pytest.approx(stats.guard.ratio, rel=1e-9)
        assert stats.plan.chosen.cost < 1.0  # below full's, which it was chosen over
        found += stats.head_tokens
    if plan != "prefix":  # these updates keep their opening: with heads, one is found
        assert (found > 0) == heads


def test_no_plan_that_computes_a_subset_of_fulls_tokens_costs_more_than_full(
    tiny: LoadedModel,
) -> None:
    """On a turn where every token after an early edit is recomputed by `prefix`, the
    planner still ranks it and `exact` below `full` (a fitted cost once put them above)."""
    e = engine(tiny, fidelity="exact")
    for update in UPDATES:
        stats = _prefill(e, update)
    assert stats.plan is not None
    considered = {x.plan: x for x in stats.plan.considered}
    assert considered["full"].cost == 1.0
    for name in ("exact", "prefix"):
        assert considered[name].cost < 1.0, (name, considered[name].cost)
    assert stats.plan.plan != "full"
