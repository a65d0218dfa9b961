"""The vLLM bench's summary and strategy parsing (no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentcache.bench.vllm.cli import vllm_strategies
from agentcache.bench.vllm.report import plot, report_markdown, summarize
from agentcache.bench.vllm.run import bench_configs


def _run(config: str, ttfts: list[float], tokens: list[int]) -> dict[str, object]:
    records = [
        {"config": config, "session": "s", "workload": "w", "turn": i, "prompt_tokens": 100,
         "ttft_ms": t, "first_token": tok, "top5": [tok, 1, 2, 3, 4],
         "claimed_tokens": 50 if i else 0, "fallbacks": 0, "fill": ("engine", "vllm")[i % 2]}
        for i, (t, tok) in enumerate(zip(ttfts, tokens, strict=True))
    ]  # fmt: skip
    return {"startup_s": 1.0, "records": records}


def test_summary_ratios_and_agreement(tmp_path: Path) -> None:
    runs = {
        "none": _run("none", [100, 100, 100], [5, 6, 7]),
        "prefix": _run("prefix", [100, 80, 60], [5, 6, 7]),
        "agentcache:rpdc": _run("agentcache:rpdc", [100, 40, 60], [5, 6, 9]),
    }
    s = summarize(runs)["configs"]
    assert s["agentcache:rpdc"]["ttft_ratio_vs_prefix_warm"] == pytest.approx(0.75)
    assert s["agentcache:rpdc"]["first_token_agreement"] == pytest.approx(2 / 3)
    assert s["agentcache:rpdc"]["top5_overlap"] == pytest.approx((1 + 1 + 0.8) / 3)
    assert s["agentcache:rpdc"]["claimed_fraction_warm"] == pytest.approx(0.5)
    assert s["prefix"]["ttft_ms_median_warm"] == pytest.approx(70)
    assert s["agentcache:rpdc"]["by_workload"] == {
        "w": {"warm_turns": 2, "ttft_ratio_vs_prefix_warm": pytest.approx(0.75),
              "turns_at_least_2x_faster": 1}
    }  # fmt: skip
    assert s["agentcache:rpdc"]["fills_warm"] == {"engine": 1, "vllm": 1}
    assert s["prefix"]["fills_warm"] == {}
    results = summarize(runs)
    report = report_markdown(results)
    assert "| agentcache:rpdc | 50 | 0.75 | 0.67 |" in report
    assert "| agentcache:rpdc | 0.75 (1 of 2) |" in report
    plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_vllm_strategies() -> None:
    assert vllm_strategies("anything", default_list=True) == ["rpdc"]
    assert vllm_strategies("full,prefix,default,pic", default_list=False) == ["rpdc", "pic"]
    assert vllm_strategies("rpdc:selection=offset:extra=1", default_list=False) == [
        "rpdc:selection=offset:extra=1"
    ]
    with pytest.raises(ValueError, match="unknown options"):
        vllm_strategies("rpdc:nope=1", default_list=False)


def test_vllm_strategies_take_a_fill() -> None:
    strategies = vllm_strategies("pic@vllm,pic@engine,pic@auto,rpdc", default_list=False)
    assert strategies == ["pic@vllm", "pic@engine", "pic", "rpdc"]
    assert bench_configs(strategies)[2:] == [f"agentcache:{s}" for s in strategies]
    with pytest.raises(ValueError, match="the fill after @ is one of auto, vllm, engine"):
        vllm_strategies("pic@gpu", default_list=False)
    with pytest.raises(ValueError, match="cannot run as a staged prefill"):
        vllm_strategies("rpdc@vllm", default_list=False)


def fake_engine_processes(
    monkeypatch: pytest.MonkeyPatch, ttfts: list[float], tokens: list[int]
) -> list[tuple[str, Path]]:
    """Stand-ins for the bench's engine processes: each writes its result and a file into
    its segment store. Returns (configuration, store folder) per process started."""
    import agentcache.bench.vllm.run as bench

    started: list[tuple[str, Path]] = []

    class FakeProcess:
        def __init__(self, args: list[str], **_: object) -> None:
            config, _, result, store = args[3:7]
            Path(store, "ab").mkdir(parents=True)
            Path(store, "ab", "x.kv").write_bytes(b"kv")
            started.append((config, Path(store)))
            Path(result).write_text(json.dumps(_run(config, ttfts, tokens)))
            self.stdout = iter([f"{bench.TURN_PREFIX}{config} s 0\n"])
            self.returncode = 0

        def __enter__(self) -> FakeProcess:
            return self

        def __exit__(self, *_: object) -> None:
            return None

    monkeypatch.setattr(bench.subprocess, "Popen", FakeProcess)
    return started


def test_each_configurations_store_is_removed_when_its_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine processes' segment stores hold GBs: only the results stay."""
    import agentcache.bench.vllm.run as bench

    started = fake_engine_processes(monkeypatch, [100.0], [5])
    seen: list[str] = []
    runs = bench._run_configs(tmp_path, [], ["pic"], seen.append, {})
    assert list(runs) == ["none", "prefix", "agentcache:pic"] and len(seen) == 3
    assert started and not any(store.exists() for _, store in started)


def test_a_rerun_with_resume_keeps_the_configurations_measured_on_the_same_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bench cut short loses only the configuration it was in: with `resume`, kept results
    for the same turns are taken, others (other turns, a cut-short file) are run again."""
    import agentcache.bench.vllm.run as bench
    from agentcache.workload.files import parse_session

    started = fake_engine_processes(monkeypatch, [100.0, 50.0], [5, 6])

    def ran() -> list[str]:
        configs = [config for config, _ in started]
        started.clear()
        return configs

    session = {"name": "s", "turns": [{"segments": [{"kind": "system", "text": "hello"}]}]}
    sessions = [parse_session(session, "s", "")]
    kept = tmp_path / "configs"
    work = tmp_path / "work"
    work.mkdir()
    first = bench._run_configs(work, sessions, ["pic"], lambda _: None, {}, kept)
    assert ran() == ["none", "prefix", "agentcache:pic"] and len(list(kept.glob("*.json"))) == 3

    (pic,) = [p for p in kept.glob("*.json") if "pic" in p.name]
    pic.write_text(pic.read_text()[:40])  # cut short
    seen: list[str] = []
    again = bench._run_configs(work, sessions, ["pic", "rpdc"], seen.append, {}, kept, True)
    assert ran() == ["agentcache:pic", "agentcache:rpdc"]  # none, prefix were kept
    assert again["none"] == first["none"] and any("(kept)" in s for s in seen)

    bench._run_configs(work, sessions, ["pic"], lambda _: None, {}, kept)  # no resume: all run
    assert ran() == ["none", "prefix", "agentcache:pic"]

    other = [parse_session(session | {"name": "t"}, "t", "")]
    bench._run_configs(work, other, ["pic"], lambda _: None, {}, kept, True)  # other turns
    assert ran() == ["none", "prefix", "agentcache:pic"]


def test_bench_cli_passes_resume_and_threads_to_the_vllm_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentcache.bench.vllm.cli as vllm_cli
    import agentcache.bench.vllm.run as bench
    from agentcache.cli import main

    calls: list[dict[str, object]] = []

    def fake_run_all(
        sessions: list[object],
        strategies: list[str],
        out: Path,
        advance: object,
        threads: int | None = None,
        resume: bool = False,
    ) -> dict[str, object]:
        calls.append({"sessions": len(sessions), "strategies": strategies, "threads": threads,
                      "resume": resume})  # fmt: skip
        return {"configs": {}, "records": []}

    monkeypatch.setattr(vllm_cli, "require_vllm", lambda: None)
    monkeypatch.setattr(bench, "run_all", fake_run_all)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(
        {"name": "s", "turns": [{"segments": [{"kind": "system", "text": "hi"}]}]}
    ))  # fmt: skip
    n = torch.get_num_threads()  # the CLI sets torch's threads for the whole process
    argv = ["bench", str(workload), "--backend", "vllm", "--strategies", "pic@vllm",
            "--threads", str(n), "--out", str(tmp_path / "out")]  # fmt: skip
    assert main([*argv, "--resume"]) == 0 and main(argv) == 0
    assert calls == [
        {"sessions": 1, "strategies": ["pic@vllm"], "threads": n, "resume": True},
        {"sessions": 1, "strategies": ["pic@vllm"], "threads": n, "resume": False},
    ]
