"""benchmarks/server/step_bound.py: what it times is the engine's own step, on contexts laid out
as the engine lays out an admitted turn's."""

from __future__ import annotations

import torch

from agentcache.decode.dense import dense_step
from agentcache.model.loading import LoadedModel
from agentcache.runtime.batch_step import call_rule
from tests.bench.scripts import load_script


def test_products_are_every_matrix_a_decode_row_goes_through(tiny: LoadedModel) -> None:
    bound = load_script("server/step_bound")
    mats = bound.products(tiny.forward)
    assert len(mats) == 7 * tiny.config.num_layers + 1
    assert mats[-1][0] is tiny.forward.weights.lm_head
    assert mats[0][0] is tiny.forward.weights.layers[0].wq


def test_contexts_are_one_run_of_slots_and_step_as_the_one_sequence_step(
    tiny: LoadedModel,
) -> None:
    """Each sequence holds its tokens on one run of slots with room for the steps; the timed
    step writes one token more, and its logits are the reference step's on a copy."""
    bound = load_script("server/step_bound")
    seqs = bound.contexts(tiny.forward, 3, 20, 4)
    for s in seqs:
        assert s.num_tokens == 20 and len(s.spans()) == 1
    starts = [s.spans()[0][0] for s in seqs]
    assert len(set(starts)) == 3  # pages of its own each
    assert bound.whole_step(tiny.forward, seqs) > 0
    assert all(s.num_tokens == 21 and len(s.spans()) == 1 for s in seqs)
    assert bound.whole_step(tiny.forward, seqs[:1]) > 0  # the one-row step extends it too
    assert seqs[0].num_tokens == 22
    # the random context is real K/V the reference step attends over
    ref = bound.contexts(tiny.forward, 1, 20, 1)[0]
    logits = dense_step(tiny.forward, ref, 7, 20)
    assert logits.shape == (tiny.config.vocab_size,) and bool(torch.isfinite(logits).all())


def test_measure_reports_each_row_count_against_one_row(tiny: LoadedModel) -> None:
    bound = load_script("server/step_bound")
    out = bound.measure(tiny.forward, [1, 4], repeats=2, context=8)
    assert out["calls"]["1"] == [1] and out["calls"]["4"] == call_rule(tiny.forward).calls(4)
    assert len(out["products_s"]["4"]) == len(out["step_s"]["4"]) == 2
    one, four = out["summary"]["1"], out["summary"]["4"]
    assert one["bound"] == one["step_speedup"] == 1.0
    assert four["bound_min"] <= four["bound"] <= four["bound_max"]
    assert four["step_speedup_min"] <= four["step_speedup"] <= four["step_speedup_max"]
    want = [4 * a / b for a, b in zip(out["products_s"]["1"], out["products_s"]["4"], strict=True)]
    assert four["bound_min"] == min(want) and four["bound_max"] == max(want)
    meta = {"provenance": {"command": "c", "commit": "x"}, "model": "m", "threads": 1}
    text = bound.report({**out, **meta, "repeats": 2, "context": 8})
    assert "| 4 |" in text and "bound(R)" in text
    rule = call_rule(tiny.forward)
    assert out["rule"] == {"block": rule.block, "cap": rule.cap, "floor": rule.floor}
    assert f"calls of {max(rule.floor, rule.block)} to {rule.cap} rows" in text
