"""Context copies (reuse/segments.py): a segment a turn reused approximately is stored as its
context copy for that context (the KV the turn used); a later prompt with the same context
loads it as it is, with `prefix`'s work. Counted, not timed.

    A : [ sys t1 ][ tools ][ q1 ]      tools' first copy, after "sys t1"
    B : [ sys t2 ][ tools ][ q2 ]      tools found, not exact, reused approximately
                                       -> tools' context copy for "sys t2"
    C : [ sys t2 ][ tools ][ q3 ]      a new conversation: the context copy, as it is
"""

from __future__ import annotations

from dataclasses import replace

import torch

from agentcache.kv.store import context_copy_id, exact_copy_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt import Segment, SegmentedPrompt
from agentcache.prompt import SegmentKind as K
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.segments import chain_ids, exact_left, find_hits
from agentcache.runtime import Engine, EngineConfig, GenerationParams

ONE = GenerationParams(max_new_tokens=1)
TOOLS = "Tool get_state(item: int): the state of an item, as JSON. " * 5
LONG = "Please compare every item in the list, one by one, and explain each. " * 6


def prompt(minute: int, question: str, scope: str | None = None) -> SegmentedPrompt:
    sys = Segment(K.SYSTEM, f"Current time: 09:{minute:02d}. Be careful.", "sys", "system", scope)
    tools = Segment(K.FIXED, TOOLS, "tools", "system", scope)
    return SegmentedPrompt([sys, tools, Segment(K.UPDATE, question, "q", "user", scope)])


A = prompt(1, "What is item 3?")
B = prompt(2, "Item 5?")  # short: the tools reused approximately after the new stamp
C = prompt(2, "And item 4?")


def copy_ids(engine: Engine, p: SegmentedPrompt, scope: str | None = None) -> tuple[str, str]:
    t = engine.tokenize(p)
    through, start = chain_ids(t)[2], t.segments[1].start
    return exact_copy_id(through, scope, start), context_copy_id(through, scope, start)


def held(engine: Engine, cid: str) -> bool:
    m = engine.model
    return engine.store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid)


def tools_kv(engine: Engine, p: SegmentedPrompt) -> tuple[torch.Tensor, torch.Tensor]:
    t = engine.tokenize(p)
    seq, _ = engine.prefill(t)
    tools = t.segments[1]
    keys, values = seq.gather_all(slice(tools.start, tools.end))
    seq.free()
    return keys, values


def test_b_stores_the_context_copy_and_c_does_prefixs_work(tiny: LoadedModel) -> None:
    prefix = Engine(tiny, EngineConfig(strategy="prefix"))
    want = [prefix.generate(p, ONE).stats for p in (A, B, C)][-1]
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    b = [engine.generate(p, ONE).stats for p in (A, B)][-1]
    assert b.reused_tokens > 0 and not b.exact_plan and b.context_copy_tokens == 0
    exact, context = copy_ids(engine, B)
    assert held(engine, context) and not held(engine, exact)
    c = engine.generate(C, ONE).stats
    t = engine.tokenize(C)
    found = t.segments[2].start  # system + tools, whole
    tools = t.segments[1]
    assert c.context_copy_tokens == len(tools.ids)
    assert c.loaded_tokens == c.reused_tokens == found
    assert c.model_calls == want.model_calls == 2 * tiny.config.num_layers + 2  # no probe
    # prefix's blocks may run on into the question's chat header (test_exact_copies.py)
    ask, b_ask = t.segments[2].ids, engine.tokenize(B).segments[2].ids
    header = next(i for i, (x, y) in enumerate(zip(ask, b_ask, strict=False)) if x != y)
    extra = want.loaded_tokens - found
    assert 0 <= extra <= min(header, 15)
    assert c.recomputed_tokens == want.recomputed_tokens + extra
    assert not c.exact_plan  # reported apart: not full recompute's KV


def test_without_the_context_copy_c_probes(tiny: LoadedModel) -> None:
    # the reference: C straight after A finds only the first copy
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    c = [engine.generate(p, ONE).stats for p in (A, C)][-1]
    assert c.context_copy_tokens == 0
    assert c.model_calls > 2 * tiny.config.num_layers + 2


def test_c_gets_bs_kv_for_the_tools_bit_for_bit(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    engine.generate(A, ONE)
    b_keys, b_values = tools_kv(engine, B)  # B's prefill: the KV its output used
    engine.generate(B, ONE)
    m = engine.model
    stored = engine.store.lookup_content(
        m.model_id, m.tokenizer.tokenizer_id, copy_ids(engine, B)[1]
    )
    assert stored.kv is not None
    assert torch.equal(stored.kv.keys, b_keys) and torch.equal(stored.kv.values, b_values)
    c_keys, c_values = tools_kv(engine, C)
    assert torch.equal(c_keys, b_keys) and torch.equal(c_values, b_values)


def test_a_context_copy_is_found_in_its_scope_only(tiny: LoadedModel) -> None:
    a, b = "tenant-a", "tenant-b"
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    for p in (prompt(1, "What is item 3?", a), prompt(2, "Item 5?", a), prompt(1, "Hi?", b)):
        engine.generate(p, ONE)
    c_a, c_b = prompt(2, "And item 4?", a), prompt(2, "And item 4?", b)
    assert held(engine, copy_ids(engine, c_a, a)[1])
    assert not held(engine, copy_ids(engine, c_b, b)[1])
    assert not held(engine, copy_ids(engine, c_b, None)[1])
    got_b = engine.generate(c_b, ONE).stats  # b's first copy, after another stamp: a probe
    assert got_b.context_copy_tokens == 0 and got_b.reused_tokens > 0
    assert engine.generate(c_a, ONE).stats.context_copy_tokens > 0


def test_an_exact_copy_wins_over_a_context_copy(tiny: LoadedModel) -> None:
    engine, other = (Engine(tiny, EngineConfig(strategy="rpdc")) for _ in range(2))
    for p in (A, B):  # B: the context copy
        engine.generate(p, ONE)
    for p in (A, prompt(2, LONG)):  # LONG computes every tools token (cover): the exact copy
        other.generate(p, ONE)
    exact, context = copy_ids(engine, C)
    m = engine.model
    got = other.store.lookup_content(m.model_id, m.tokenizer.tokenizer_id, exact)
    assert got.kv is not None and engine.store.put_content(exact, got.kv)
    assert held(engine, exact) and held(engine, context)
    seq, pre = engine.prefill(engine.tokenize(C))
    assert pre.stats.copies_found == 1 and pre.stats.context_copies_found == 0
    assert pre.stats.context_copy_tokens == 0
    seq.free()


def test_the_exact_floor_does_not_use_a_context_copy(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    for p in (A, B):
        engine.generate(p, ONE)
    assert held(engine, copy_ids(engine, C)[1])
    t = engine.tokenize(C)
    seen = ReuseStats(t.num_tokens, tiny.config.num_layers)
    assert sum(h.context_copy for h in find_hits(engine.ctx, t, seen)) == 1
    off = ReuseStats(t.num_tokens, tiny.config.num_layers)
    hits = find_hits(replace(engine.ctx, context_copies=False), t, off)
    assert not any(h.context_copy for h in hits) and off.context_copy_tokens == 0
    options = {"plan": {"fidelity": "exact"}}
    planned = Engine(tiny, EngineConfig(strategy="plan", strategy_options=options), engine.store)
    assert planned.generate(C, ONE).stats.context_copy_tokens == 0


def test_nothing_after_a_context_copy_counts_as_exact(tiny: LoadedModel) -> None:
    # C loads the tools' context copy: the exact prefix its commit sees ends where it starts,
    # so no exact copy is stored from K/V computed after approximate K/V
    engine = Engine(tiny, EngineConfig(strategy="rpdc"))
    for p in (A, B):
        engine.generate(p, ONE)
    t = engine.tokenize(C)
    seq, pre = engine.prefill(t)
    assert pre.stats.context_copy_tokens > 0
    left = exact_left(seq)
    assert left is not None and left.exact_tokens <= t.segments[1].start
    seq.free()
