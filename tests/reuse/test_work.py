"""Reuse never does more work than it must, counted (model calls, tokens loaded and computed),
not timed: a miss is `full`'s work, an exact turn is `prefix`'s, and a plan that would cost
more than recomputing is not taken."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import StoredKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse import STRATEGIES
from agentcache.reuse.base import PrefillResult, ReuseStats, ReuseStrategy, context_reader
from agentcache.reuse.guard import CostModel, PlanCost, full_cost, guard
from agentcache.reuse.prefix import load_blocks
from agentcache.reuse.strategies import EPIC, RPDC
from agentcache.runtime import Engine, EngineConfig, GenerationParams, TurnStats

ONE = GenerationParams(max_new_tokens=1)
HISTORY = [
    Segment(K.FIXED, "Earlier the user asked about trains to Lyon. " * 3, "h1", "user"),
    Segment(K.FIXED, "Reflection: check the timetable first. " * 3, "h2", "assistant"),
]


SYSTEM = Segment(K.SYSTEM, "You are a careful agent. " * 4, "sys", "system")


def prompt(tiny: LoadedModel, update: str, history: bool = True) -> SegmentedPrompt:
    rest = HISTORY if history else []
    tail = Segment(K.UPDATE, "Now answer the new question:", "obs", "user")
    return SegmentedPrompt([SYSTEM, Segment(K.UPDATE, update, "memory", "user"), *rest, tail])


def second_turn(
    tiny: LoadedModel,
    name: str,
    first: SegmentedPrompt,
    then: SegmentedPrompt,
    options: dict[str, Any] | None = None,
    cost_guard: bool = True,
) -> TurnStats:
    config = EngineConfig(strategy=name, cost_guard=cost_guard)
    engine = Engine(tiny, replace(config, strategy_options={name: options or {}}))
    engine.generate(first, ONE)
    return engine.generate(then, ONE).stats


def counts(s: TurnStats) -> tuple[int, int, int]:
    return s.model_calls, s.loaded_tokens, s.recomputed_tokens


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_a_miss_makes_exactly_fulls_model_calls(tiny: LoadedModel, name: str) -> None:
    p = prompt(tiny, "memory v1")
    full = Engine(tiny, EngineConfig(strategy="full")).generate(p, ONE).stats
    s = Engine(tiny, EngineConfig(strategy=name)).generate(p, ONE).stats
    assert counts(s) == counts(full) == (2 * tiny.config.num_layers + 2, 0, s.prompt_tokens)
    assert s.recompute_fraction == full.recompute_fraction == 1.0
    assert not s.guarded


def prefix_work(
    tiny: LoadedModel, first: SegmentedPrompt, then: SegmentedPrompt
) -> tuple[int, int]:
    """Tokens exact prefix reuse loads in `then` after `first` (the whole 16-token blocks of
    their common token prefix, which runs past the system segment into the next one's chat
    header), and what segment-wise reuse finds exact: the whole common token prefix (the
    system segment, then the opening the next segment shares with the one stored after it,
    its head)."""
    engine = Engine(tiny)
    a, b = engine.tokenize(first).ids, engine.tokenize(then).ids
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    assert common > len(engine.tokenize(then).segments[0].ids)  # into the next segment
    return common // 16 * 16, common


def test_a_prefix_hit_under_the_default_loads_what_prefix_loads(tiny: LoadedModel) -> None:
    # system prompt found, everything after it new (the server's system + tools hit)
    first, then = prompt(tiny, "memory v1", False), prompt(tiny, "another question", False)
    prefix = second_turn(tiny, "prefix", first, then)
    default = second_turn(tiny, "rpdc", first, then)
    blocks, common = prefix_work(tiny, first, then)
    assert (prefix.loaded_tokens, default.loaded_tokens) == (blocks, common)
    assert 0 <= common - blocks < 16  # what prefix's last block leaves of the common prefix
    assert default.model_calls == prefix.model_calls
    for s in (prefix, default):
        assert s.loaded_tokens + s.recomputed_tokens == s.prompt_tokens


def test_an_exact_turn_under_the_default_does_prefixs_work(tiny: LoadedModel) -> None:
    # the update grows: h1 and h2 shift behind it; few enough for cover=1.5 to compute them
    first, then = prompt(tiny, "memory v1"), prompt(tiny, "memory v2, much longer: " * 12)
    prefix = second_turn(tiny, "prefix", first, then)
    default = second_turn(tiny, "rpdc", first, then)
    blocks, common = prefix_work(tiny, first, then)
    assert default.exact_plan and default.reused_tokens > default.loaded_tokens  # h1, h2 not loaded
    assert (prefix.loaded_tokens, default.loaded_tokens) == (blocks, common)
    assert default.model_calls == prefix.model_calls
    for s in (prefix, default):
        assert s.loaded_tokens + s.recomputed_tokens == s.prompt_tokens


def prefill(
    engine: Engine, strategy: ReuseStrategy, p: TokenizedPrompt
) -> tuple[PrefillResult, list[tuple[Tensor, Tensor]]]:
    seq = SequenceKV(engine.ctx.pool)
    pre = strategy.prefill(engine.ctx, p, seq)
    kv = [seq.gather(layer) for layer in range(engine.model.config.num_layers)]
    seq.free()
    return pre, kv


@pytest.mark.parametrize("cls", [RPDC, EPIC])
def test_not_loading_computed_tokens_agrees_with_loading_them(
    tiny: LoadedModel, cls: type[RPDC] | type[EPIC]
) -> None:
    class LoadsAll(cls):  # type: ignore[valid-type,misc]
        skip_computed_loads = False  # the reference: every reused token loaded, then computed

    engine = Engine(tiny, EngineConfig(strategy=cls.name))
    engine.generate(prompt(tiny, "memory v1"), ONE)
    p = engine.tokenize(prompt(tiny, "memory v2, much longer: " * 12))
    fast, fast_kv = prefill(engine, cls(), p)
    ref, ref_kv = prefill(engine, LoadsAll(), p)
    assert fast.stats.loaded_tokens < ref.stats.loaded_tokens
    torch.testing.assert_close(fast.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for (k, v), (rk, rv) in zip(fast_kv, ref_kv, strict=True):
        torch.testing.assert_close(k, rk, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, rv, atol=1e-5, rtol=1e-5)


def test_an_exact_turn_agrees_with_full_recompute(tiny: LoadedModel) -> None:
    then = prompt(tiny, "memory v2, much longer: " * 12)
    engine = Engine(tiny)
    engine.generate(prompt(tiny, "memory v1"), ONE)
    exact = engine.generate(then, ONE)
    ref = Engine(tiny, EngineConfig(strategy="full")).generate(then, ONE)
    assert exact.stats.exact_plan
    torch.testing.assert_close(exact.first_token_logits, ref.first_token_logits, atol=1e-4, rtol=0)


def test_a_plan_dearer_than_recomputing_is_not_taken_and_is_counted(tiny: LoadedModel) -> None:
    # cacheblend with every candidate selected: a check pass over every token, then every
    # candidate through the later layers as scattered queries, and every reused token loaded
    options = {"ratio": 1.0}
    first, then = prompt(tiny, "memory v1"), prompt(tiny, "memory v2 " * 3)
    guarded = second_turn(tiny, "cacheblend", first, then, options)
    taken = second_turn(tiny, "cacheblend", first, then, options, cost_guard=False)
    full = Engine(tiny, EngineConfig(strategy="full")).generate(then, ONE).stats
    assert guarded.guarded and not taken.guarded
    assert guarded.plan_cost == taken.plan_cost and guarded.full_cost == taken.full_cost
    assert guarded.plan_cost is not None and guarded.full_cost is not None
    assert guarded.plan_cost > guarded.full_cost
    assert counts(guarded) == counts(full) and guarded.reused_tokens == 0
    assert taken.reused_tokens > 0


def test_the_guard_compares_predicted_units() -> None:
    costs = CostModel(attention_per_pair=0.01, load_per_token_layer=0.001, num_layers=4)
    full = full_cost(100, 4)
    assert full == PlanCost(400.0, 4 * 5050.0, 0, 10)
    cheap = PlanCost(200.0, 1000.0, 50, 10)
    dear = PlanCost(400.0, 4 * 5050.0, 10, 10)  # full's work and a load besides
    assert guard(cheap, full, costs).taken
    decision = guard(dear, full, costs)
    assert not decision.taken and decision.ratio > 1.0


def test_stats_without_a_plan_have_no_guard() -> None:
    s = ReuseStats(10, 2)
    assert s.guard is None and not s.guarded


def test_the_context_read_in_place_agrees_with_the_gathered_copy(tiny: LoadedModel) -> None:
    engine = Engine(tiny)
    seq = SequenceKV(engine.ctx.pool)
    seq.reserve(3)  # one run of slots: read as views of the pool
    seq.extend(40)
    g = torch.Generator().manual_seed(0)
    shape = (tiny.config.num_layers, 40, tiny.config.num_kv_heads, tiny.config.head_dim)
    seq.write_all(seq.slots(), torch.randn(shape, generator=g), torch.randn(shape, generator=g))
    read = context_reader(seq)
    assert read is not seq.gather
    for layer in range(tiny.config.num_layers):
        for fast, ref in zip(read(layer), seq.gather(layer), strict=True):
            assert torch.equal(fast, ref)
    seq.free()


def test_prefix_loads_its_blocks_in_place_as_one_copy_would(tiny: LoadedModel) -> None:
    engine = Engine(tiny)
    g = torch.Generator().manual_seed(1)
    shape = (tiny.config.num_layers, 16, tiny.config.num_kv_heads, tiny.config.head_dim)
    blocks = [
        StoredKV(torch.randn(shape, generator=g), torch.randn(shape, generator=g),
                 torch.arange(16 * i, 16 * i + 16), "m", "t")
        for i in range(3)
    ]  # fmt: skip
    seq = SequenceKV(engine.ctx.pool)
    seq.extend(48)
    load_blocks(seq, blocks, 40)
    keys, values = seq.gather_all(slice(0, 40))
    assert torch.equal(keys, torch.cat([b.keys for b in blocks], dim=1)[:, :40])
    assert torch.equal(values, torch.cat([b.values for b in blocks], dim=1)[:, :40])
    seq.free()
