"""The `transformers-prefix` peer: reuses exactly the longest common token prefix and
matches a full prefill; the bench runs it beside the strategies and reports it like one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.bench.peer import PEER, TransformersPrefix
from agentcache.bench.reuse.harness import BenchRunner, parse_specs
from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.runtime.engine import Engine
from agentcache.testing import tiny_hf_model
from agentcache.workload.files import load_workload
from tests.bench.reuse.test_bench import write_workload


@pytest.fixture(scope="module")
def hf() -> Any:
    return tiny_hf_model()  # the `tiny` fixture's weights


def full_logits(hf: Any, ids: list[int]) -> torch.Tensor:
    return hf(input_ids=torch.tensor([ids])).logits[0, -1]


def _ids_prompt(ids: list[int]) -> TokenizedPrompt:
    """A prompt of these token ids, one update segment."""
    seg = Segment(SegmentKind.UPDATE, "x", "ids")
    return TokenizedPrompt((TokenizedSegment(seg, tuple(ids), 0),), tuple(ids))


def test_it_reuses_the_common_prefix_and_matches_full_prefill(hf: Any, tiny: LoadedModel) -> None:
    peer = TransformersPrefix(hf)
    first = list(range(10, 90))
    logits, reused = peer.prefill(first)
    assert reused == 0
    torch.testing.assert_close(logits, full_logits(hf, first), atol=1e-5, rtol=0)
    engine = Engine(tiny)  # agentcache's own forward on the same weights
    seq, pre = engine.prefill(_ids_prompt(first), "full")
    seq.free()
    torch.testing.assert_close(logits, pre.logits, atol=1e-4, rtol=0)
    peer.step(7)  # the cache now holds a generated token too
    second = first[:50] + list(range(100, 140))
    logits, reused = peer.prefill(second)
    assert reused == 50 and len(peer.ids) == len(second)
    torch.testing.assert_close(logits, full_logits(hf, second), atol=1e-5, rtol=0)
    logits, reused = peer.prefill(second)  # the same prompt: all but the last token
    assert reused == len(second) - 1
    torch.testing.assert_close(logits, full_logits(hf, second), atol=1e-5, rtol=0)
    step = peer.step(3)
    torch.testing.assert_close(step, full_logits(hf, [*second, 3]), atol=1e-5, rtol=0)


def test_the_bench_reports_the_peer_like_a_strategy(
    hf: Any, tiny: LoadedModel, tmp_path: Path
) -> None:
    session = load_workload(write_workload(tmp_path / "w.jsonl")).sessions[0]
    runner = BenchRunner(tiny, parse_specs(f"prefix,{PEER}"), 256, TransformersPrefix(hf))
    records = runner.run_session(session, lambda _: None)
    peer = [r for r in records if r["strategy"] == PEER]
    prefix = [r for r in records if r["strategy"] == "prefix"]
    assert [r["turn"] for r in peer] == [0, 1]
    assert peer[0]["reused_tokens"] == 0 and peer[1]["reused_tokens"] > 0
    # exact reuse: whatever it reuses, its outputs are full prefill's up to float noise
    for r in peer:
        assert r["tf_kl"] < 1e-6 and r["greedy_exact_match"] == 1.0
        assert r["recomputed_tokens"] == r["prompt_tokens"] - r["reused_tokens"]
    # exact-prefix reuse in 16-token blocks reuses no more than the token-exact peer
    assert prefix[1]["reused_tokens"] <= peer[1]["reused_tokens"]


def test_the_peer_needs_its_model() -> None:
    with pytest.raises(ConfigError, match=f"{PEER} needs the checkpoint's transformers model"):
        BenchRunner(None, parse_specs(PEER))  # type: ignore[arg-type]


def test_bench_cli_measures_the_peer_and_says_what_it_measured(
    hf: Any, tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentcache.bench import cli as bench_cli
    from agentcache.cli import main

    monkeypatch.setattr(bench_cli, "load_model", lambda path, cache_dir: tiny)
    monkeypatch.setattr(bench_cli, "load_peer", lambda path, cache_dir: hf)
    workload = write_workload(tmp_path / "w.jsonl")
    out = tmp_path / "out"
    argv = ["bench", str(workload), "--strategies", f"pic,{PEER}", "--out", str(out),
            "--threads", "1", "--max-turns", "2"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["strategies"]) == {"full", "pic", PEER}
    assert (results["split"], results["num_sessions"], results["num_turns"]) == ("validate", 1, 2)
    report = (out / "report.md").read_text()
    assert "Split: validate (validate sessions); 1 sessions, 2 turns (1 warm)." in report
    assert f"| {PEER} |" in report


def test_cope_with_the_peer_named_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentcache.bench import cli as bench_cli
    from agentcache.cli import main
    from tests.conftest import no_model

    monkeypatch.setattr(bench_cli, "load_model", no_model)
    argv = ["bench", str(write_workload(tmp_path / "w.jsonl")), "--cope", "--strategies",
            f"pic,{PEER}", "--out", str(tmp_path / "out"), "--threads", "1"]  # fmt: skip
    assert main(argv) == 2
    assert f"--cope: {PEER} runs the model without its CoPE adapter" in capsys.readouterr().err
