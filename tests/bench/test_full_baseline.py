from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcache.model.loading import from_hf
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.prompt import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine
from agentcache.testing import tiny_hf_model
from tests.bench.scripts import load_script


def test_times_the_same_prompt_both_ways_and_checks_the_logits_agree() -> None:
    fb = load_script("reuse/full_baseline")
    hf = tiny_hf_model()
    model = from_hf(hf, ByteTokenizer(), "tiny")
    engine = Engine(model)
    prompts = [
        (f"p:{n}", engine.tokenize(SegmentedPrompt([Segment(SegmentKind.SYSTEM, "ab " * n)])))
        for n in (20, 60)
    ]
    timings = fb.run(model, hf, prompts, repeats=2)
    assert [t.tokens for t in timings] == [p.num_tokens for _, p in prompts]
    for t in timings:
        assert t.engine_ms > 0 and t.hf_ms > 0
        assert t.ratio == pytest.approx(t.engine_ms / t.hf_ms)
        assert t.max_logit_diff < 1e-3  # same weights, same next-token logits
    md = fb.report(timings, "cmd")
    assert "| p:60 |" in md and "Median ratio" in md


def test_picks_prompts_spread_over_lengths(tmp_path: Path) -> None:
    fb = load_script("reuse/full_baseline")
    engine = Engine(from_hf(tiny_hf_model(), ByteTokenizer(), "tiny"))
    turns = [{"segments": [{"kind": "system", "text": "x " * (10 * (i + 1))}]} for i in range(5)]
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"name": "s", "turns": turns}) + "\n")
    picked = fb.pick_prompts(engine, [wl], sessions=1, per_file=3)
    assert [name for name, _ in picked] == ["s:0", "s:2", "s:4"]  # shortest, middle, longest
    assert len(fb.pick_prompts(engine, [wl], sessions=1, per_file=9)) == 5
