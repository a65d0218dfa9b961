"""Exact copies (reuse/segments.py): a segment the store holds from another context, computed
exactly in this one, is stored as its exact copy for this context; a later prompt with the
same context finds it as an exact run and does exact prefix reuse's work. Counted, not timed.

    1 : [ sys t1 ][ tools ][ q1 ]          tools' first copy, after "sys t1"
    2 : [ sys t2 ][ tools ][ long q2 ]     tools found, not exact; few enough beside q2 for
                                           cover=1.5 to compute them all: the exact copy
    3 : [ sys t2 ][ tools ][ q3 ]          tools found exact: `prefix`'s work
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import exact_copy_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.base import PrefillResult
from agentcache.reuse.segments import chain_ids, exact_left
from agentcache.reuse.strategies import RPDC
from agentcache.runtime import Engine, EngineConfig, GenerationParams, TurnStats

ONE = GenerationParams(max_new_tokens=1)
TOOLS = "Tool get_state(item: int): the state of an item, as JSON. " * 5
LONG = "Please compare every item in the list, one by one, and explain each. " * 6


def system(minute: int, scope: str | None = None) -> Segment:
    return Segment(K.SYSTEM, f"Current time: 09:{minute:02d}. Be careful.", "sys", "system", scope)


def prompt(minute: int, question: str, scope: str | None = None) -> SegmentedPrompt:
    tools = Segment(K.FIXED, TOOLS, "tools", "system", scope)
    ask = Segment(K.UPDATE, question, "q", "user", scope)
    return SegmentedPrompt([system(minute, scope), tools, ask])


FIRST = prompt(1, "What is item 3?")  # the tools' first copy, after another stamp
SETUP = prompt(2, LONG)  # computes the tools block exactly after the new stamp
THEN = prompt(2, "And item 4?")  # the same system + tools, a new conversation


def run(tiny: LoadedModel, strategy: str, *prompts: SegmentedPrompt) -> tuple[Engine, TurnStats]:
    engine = Engine(tiny, EngineConfig(strategy=strategy))
    stats = [engine.generate(p, ONE).stats for p in prompts]
    return engine, stats[-1]


def tools_copy(engine: Engine, p: SegmentedPrompt, scope: str | None = None) -> str:
    t = engine.tokenize(p)
    seg = t.segments[1]
    return exact_copy_id(chain_ids(t)[2], scope, seg.start)


def held(engine: Engine, cid: str) -> bool:
    m = engine.model
    return engine.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid)


def prefill(engine: Engine, p: SegmentedPrompt) -> tuple[SequenceKV, PrefillResult]:
    return engine.prefill(engine.tokenize(p))


def test_the_setup_computes_the_tools_exactly_and_stores_their_copy(tiny: LoadedModel) -> None:
    engine, setup = run(tiny, "rpdc", FIRST, SETUP)
    assert setup.exact_plan and setup.probe_skipped  # every tools token computed (cover)
    assert held(engine, tools_copy(engine, SETUP))
    assert not held(engine, tools_copy(engine, FIRST))  # the first copy serves its own context


def test_a_prefix_hit_after_another_stamp_does_prefixs_work(tiny: LoadedModel) -> None:
    _, prefix = run(tiny, "prefix", FIRST, SETUP, THEN)
    engine, default = run(tiny, "rpdc", FIRST, SETUP, THEN)
    t = engine.tokenize(THEN)
    found = t.segments[2].start  # system + tools, whole
    # and the opening the new question shares with the one stored after this very context
    # (its chat header): its head, exact here
    ask, setup_ask = t.segments[2].ids, engine.tokenize(SETUP).segments[2].ids
    header = next(i for i, (x, y) in enumerate(zip(ask, setup_ask, strict=False)) if x != y)
    assert header > 0
    assert default.loaded_tokens == default.reused_tokens == found + header
    # prefix's blocks cover the same tokens up to its last whole block: reuse by segments
    # computes what prefix computes, less the opening past that block
    extra = found + header - prefix.loaded_tokens
    assert 0 <= extra <= 15
    assert default.recomputed_tokens == prefix.recomputed_tokens - extra
    assert default.model_calls == prefix.model_calls == 2 * tiny.config.num_layers + 2  # no probe
    assert default.exact_plan and default.loaded_tokens + default.recomputed_tokens == t.num_tokens


def test_without_the_copy_the_same_turn_probes(tiny: LoadedModel) -> None:
    # the reference: no setup in the new context, so the tools are found after another stamp
    _, default = run(tiny, "rpdc", FIRST, THEN)
    assert not default.exact_plan
    assert default.model_calls > 2 * tiny.config.num_layers + 2


def test_an_exact_copy_gives_full_recomputes_logits_and_kv(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST, SETUP)
    seq, pre = prefill(engine, THEN)
    assert pre.stats.copies_found == 1 and pre.stats.exact is not None
    assert bool(pre.stats.exact[pre.stats.reused].all())  # every reused token exact
    full = Engine(tiny, EngineConfig(strategy="full"))
    ref_seq, ref = full.prefill(full.tokenize(THEN))
    assert ref.logits.dtype == torch.float32
    torch.testing.assert_close(pre.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for layer in range(tiny.config.num_layers):
        for got, want in zip(seq.gather(layer), ref_seq.gather(layer), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    seq.free()
    ref_seq.free()


def test_the_copy_holds_the_kv_full_recompute_computes_there(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST, SETUP)
    m = engine.model
    cid = tools_copy(engine, SETUP)
    copy = engine.store.lookup_content(m.model_id, m.tokenizer.tokenizer_id, cid)
    assert copy.kv is not None
    full = Engine(tiny, EngineConfig(strategy="full"))
    t = full.tokenize(SETUP)
    seq, _ = full.prefill(t)
    tools = t.segments[1]
    keys, values = seq.gather_all(slice(tools.start, tools.end))
    torch.testing.assert_close(copy.kv.keys, keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(copy.kv.values, values, atol=1e-5, rtol=1e-5)
    assert torch.equal(copy.kv.positions, torch.arange(tools.start, tools.end))
    seq.free()


def test_an_exact_turn_commits_only_what_is_new(tiny: LoadedModel) -> None:
    engine, _ = run(tiny, "rpdc", FIRST, SETUP)
    before = engine.store.stats.entries
    engine.generate(THEN, ONE)
    assert engine.store.stats.entries == before + 1  # the new question; no copy of found KV


def test_a_copy_is_found_in_its_scope_only(tiny: LoadedModel) -> None:
    a, b = "tenant-a", "tenant-b"
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    for p in (prompt(1, "What is item 3?", a), prompt(2, LONG, a), prompt(1, "What is item 3?", b)):
        engine.generate(p, ONE)
    then_a, then_b = prompt(2, "And item 4?", a), prompt(2, "And item 4?", b)
    assert held(engine, tools_copy(engine, then_a, a))
    assert not held(engine, tools_copy(engine, then_b, b))
    seq, pre = prefill(engine, then_b)  # the tools found in b: its first copy, not a's copy
    assert pre.stats.copies_found == 0 and pre.stats.reused_tokens > 0
    assert pre.stats.exact is not None and not bool(pre.stats.exact[pre.stats.reused].all())
    seq.free()
    seq, pre = prefill(engine, then_a)
    assert pre.stats.copies_found == 1
    seq.free()


@pytest.mark.parametrize("strategy", ["rpdc", "pic", "epic"])
def test_approximate_kv_is_never_stored_as_a_copy(tiny: LoadedModel, strategy: str) -> None:
    # a short question after the new stamp: the tools are reused approximately
    short = prompt(2, "Item 5?")
    engine, turn = run(tiny, strategy, FIRST, short)
    assert turn.reused_tokens > 0 and not turn.exact_plan
    assert not held(engine, tools_copy(engine, short))
    # the same prompt again, its context copy (test_context_copies.py) not used: approximate
    t, seq = engine.tokenize(short), SequenceKV(engine.ctx.pool)
    ctx = replace(engine.ctx, context_copies=False)
    pre = engine.strategy(strategy).prefill(ctx, t, seq)
    left = exact_left(seq)
    tools = engine.tokenize(short).segments[1]
    # epic computes the first 64 tools tokens: exact, those after them not
    assert left is not None and left.exact_tokens < tools.end and left.recomputed == ()
    assert pre.stats.copies_found == 0
    seq.free()


def test_a_guarded_plan_stores_the_copy_it_computed(tiny: LoadedModel) -> None:
    # cacheblend computing every candidate costs more than full recompute: full runs, exact
    options = {"cacheblend": {"ratio": 1.0}}
    engine = Engine(tiny, EngineConfig(strategy="cacheblend", strategy_options=options))
    engine.generate(FIRST, ONE)
    turn = engine.generate(prompt(2, "Item 5?"), ONE).stats
    assert turn.guarded
    assert held(engine, tools_copy(engine, prompt(2, "Item 5?")))


def test_running_an_exact_plan_as_prefix_agrees_with_the_executor(tiny: LoadedModel) -> None:
    class Executor(RPDC):
        prefix_compute = False  # the reference: the layer executor runs the computed tokens

    engine, _ = run(tiny, "rpdc", FIRST)
    t = engine.tokenize(SETUP)
    runs = []
    for strategy in (RPDC(), Executor()):
        seq = SequenceKV(engine.ctx.pool)
        pre = strategy.prefill(engine.ctx, t, seq)
        kv = [seq.gather(layer) for layer in range(tiny.config.num_layers)]
        left = exact_left(seq)
        seq.free()
        runs.append((pre, kv, left))
    (fast, fast_kv, fast_left), (ref, ref_kv, ref_left) = runs
    assert fast.stats.exact_plan and ref.stats.exact_plan
    assert fast.stats.model_calls == ref.stats.model_calls
    assert fast.stats.recomputed_tokens == ref.stats.recomputed_tokens
    assert fast_left == ref_left and fast_left is not None and fast_left.recomputed
    torch.testing.assert_close(fast.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for (k, v), (rk, rv) in zip(fast_kv, ref_kv, strict=True):
        torch.testing.assert_close(k, rk, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, rv, atol=1e-5, rtol=1e-5)
