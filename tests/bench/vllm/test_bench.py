"""The vLLM bench's rounds, summary and strategy parsing (no vLLM: engine processes faked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.bench.stats import quantile
from agentcache.bench.vllm.cli import vllm_strategies
from agentcache.bench.vllm.pairs import PAIRING
from agentcache.bench.vllm.report import merge_rounds, plot, report_markdown, summarize
from agentcache.bench.vllm.run import bench_configs, round_orders


def _run(config: str, ttfts: list[float], tokens: list[int]) -> dict[str, Any]:
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
    # the provenance's git calls would go through the fake Popen below
    monkeypatch.setattr(
        bench, "run_provenance", lambda *_: {"commit": "test", "command": "agentcache bench"}
    )

    class FakeProcess:
        def __init__(self, args: list[str], **_: object) -> None:
            config, _sessions, result, store = args[3:7]
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
    assert [run["config"] for run in runs] == ["none", "prefix", "agentcache:pic"]
    assert len(seen) == 3
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
    assert again[0] == first[0] | {"kept": True} and any("(kept)" in s for s in seen)

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
        rounds: int = 1,
    ) -> dict[str, object]:
        calls.append({"sessions": len(sessions), "strategies": strategies, "threads": threads,
                      "resume": resume, "rounds": rounds})  # fmt: skip
        return {"configs": {}, "records": [], "rounds": rounds}

    monkeypatch.setattr(vllm_cli, "require_vllm", lambda: None)
    monkeypatch.setattr(bench, "run_all", fake_run_all)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(
        {"name": "s", "turns": [{"segments": [{"kind": "system", "text": "hi"}]}]}
    ))  # fmt: skip
    n = torch.get_num_threads()  # the CLI sets torch's threads for the whole process
    argv = ["bench", str(workload), "--backend", "vllm", "--strategies", "pic@vllm",
            "--threads", str(n), "--out", str(tmp_path / "out")]  # fmt: skip
    assert main([*argv, "--resume"]) == 0 and main([*argv, "--rounds", "3"]) == 0
    assert calls == [
        {"sessions": 1, "strategies": ["pic@vllm"], "threads": n, "resume": True, "rounds": 1},
        {"sessions": 1, "strategies": ["pic@vllm"], "threads": n, "resume": False, "rounds": 3},
    ]
    embedded = ["bench", str(workload), "--rounds", "2", "--out", str(tmp_path / "e")]
    assert main(embedded) == 2 and len(calls) == 2  # --rounds is the vLLM bench's


def test_each_round_rotates_the_order_so_every_configuration_takes_every_slot() -> None:
    configs = ["a", "b", "c", "d"]
    orders = round_orders(configs, 5)
    assert orders == [list("abcd"), list("bcda"), list("cdab"), list("dabc"), list("abcd")]
    for slot in range(4):
        assert sorted(order[slot] for order in orders[:4]) == configs
    assert round_orders(configs, 1) == [configs]


def test_rounds_run_each_configuration_round_in_its_own_process_in_rotated_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentcache.bench.vllm.run as bench

    started = fake_engine_processes(monkeypatch, [100.0, 50.0], [5, 6])
    seen: list[str] = []
    results = bench.run_all([], ["pic"], tmp_path / "out", seen.append, rounds=2)
    order = ["none", "prefix", "agentcache:pic", "prefix", "agentcache:pic", "none"]
    assert [config for config, _ in started] == order
    assert len({store for _, store in started}) == 6  # a store (and a process) of its own
    assert seen[0].startswith("round 0 none") and seen[3].startswith("round 1 prefix")
    assert [(i["round"], i["slot"], i["config"], i["kept"]) for i in results["schedule"]] == [
        (i // 3, i % 3, config, False) for i, config in enumerate(order)
    ]
    assert results["rounds"] == 2 and results["pairing"] == PAIRING
    pic = [r for r in results["records"] if r["config"] == "agentcache:pic"]
    assert [(r["round"], r["turn"]) for r in pic] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert results["configs"]["agentcache:pic"]["rounds"] == [0, 1]
    stored = json.loads((tmp_path / "out" / "results.json").read_text())
    assert stored["schedule"] == results["schedule"]
    assert len(list((tmp_path / "out" / "configs").glob("*-round1.json"))) == 3


def test_resume_runs_only_the_configuration_rounds_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept per configuration-round: a cut-short round-1 result is measured again, round 0's
    is not; more rounds run only the new rounds."""
    import agentcache.bench.vllm.run as bench

    started = fake_engine_processes(monkeypatch, [100.0, 50.0], [5, 6])
    kept, work = tmp_path / "configs", tmp_path / "work"
    work.mkdir()
    bench._run_configs(work, [], ["pic"], lambda _: None, {}, kept, rounds=2)
    assert len(started) == 6 and len(list(kept.glob("*.json"))) == 6
    started.clear()

    (cut,) = [p for p in kept.glob("*pic*-round1.json")]
    cut.write_text(cut.read_text()[:40])
    runs = bench._run_configs(work, [], ["pic"], lambda _: None, {}, kept, True, rounds=2)
    assert [config for config, _ in started] == ["agentcache:pic"]
    assert [(r["round"], r["config"], r["kept"]) for r in runs if not r["kept"]] == [
        (1, "agentcache:pic", False)
    ]
    assert [r["slot"] for r in runs] == [0, 1, 2, 0, 1, 2]
    started.clear()

    runs = bench._run_configs(work, [], ["pic"], lambda _: None, {}, kept, True, rounds=3)
    assert [config for config, _ in started] == ["agentcache:pic", "none", "prefix"]  # round 2
    assert all(r["kept"] == (r["round"] < 2) for r in runs)


def _round_run(config: str, rnd: int, ttfts: list[float], tokens: list[int]) -> dict[str, Any]:
    """A configuration-round as `run._run_configs` returns it."""
    run = _run(config, ttfts, tokens)
    records = [r | {"round": rnd} for r in run["records"]]
    costs = {"vllm": 1.0 + rnd, "engine": 4.0} if config.startswith("agentcache") else {}
    return run | {"config": config, "round": rnd, "startup_s": 1.0 + 2 * rnd,
                  "fill_costs": costs, "records": records}  # fmt: skip


def paired_rounds() -> dict[str, Any]:
    """Two rounds, the second on a machine twice as slow for the baselines; `none`'s first
    token on the last turn differs between rounds (and agentcache's with it)."""
    runs = [
        _round_run("none", 0, [100, 100, 100], [5, 6, 7]),
        _round_run("prefix", 0, [100, 80, 50], [5, 6, 7]),
        _round_run("agentcache:pic", 0, [100, 40, 40], [5, 6, 7]),
        _round_run("prefix", 1, [200, 160, 100], [5, 6, 8]),
        _round_run("agentcache:pic", 1, [200, 40, 100], [5, 6, 8]),
        _round_run("none", 1, [200, 200, 250], [5, 6, 8]),
    ]
    schedule = [{"config": r["config"], "round": r["round"], "slot": i % 3}
                for i, r in enumerate(runs)]  # fmt: skip
    return summarize(merge_rounds(runs), schedule)


def test_ratios_pair_turns_of_the_same_round() -> None:
    results = paired_rounds()
    pic = results["configs"]["agentcache:pic"]
    # over prefix: round 0 40/80, 40/50; round 1 40/160, 100/100
    vs_prefix = [0.25, 0.5, 0.8, 1.0]
    assert pic["n_pairs"] == 4 and pic["rounds"] == [0, 1]
    assert pic["ttft_vs_prefix_paired_median"] == pytest.approx(0.65)
    assert pic["ttft_vs_prefix_paired_min"] == pytest.approx(0.25)
    assert pic["ttft_vs_prefix_paired_max"] == pytest.approx(1.0)
    assert pic["ttft_vs_prefix_paired_q25"] == pytest.approx(0.4375)
    assert pic["ttft_vs_prefix_paired_q75"] == pytest.approx(0.85)
    assert pic["ttft_vs_prefix_paired_q25"] == pytest.approx(quantile(vs_prefix, 0.25))
    assert pic["ttft_ratio_vs_prefix_warm"] == pytest.approx(0.65)  # the key stored runs have
    # over none: round 0 40/100, 40/100; round 1 40/200, 100/250
    assert pic["ttft_vs_none_paired_median"] == pytest.approx(0.4)
    assert pic["ttft_vs_none_paired_min"] == pytest.approx(0.2)
    assert pic["ttft_vs_none_paired_q25"] == pytest.approx(0.35)
    assert pic["first_token_agreement"] == 1.0  # against none of the same round
    by_workload = {"warm_turns": 4, "ttft_ratio_vs_prefix_warm": pytest.approx(0.65),
                   "turns_at_least_2x_faster": 2}  # fmt: skip
    assert pic["by_workload"] == {"w": by_workload}
    assert (pic["turns"], pic["measured_turns"]) == (3, 6)
    assert pic["startup_s"] == 2.0  # the median over rounds, as each fill cost
    assert pic["fill_costs_ms_per_token"] == {"engine": 4.0, "vllm": 1.5}
    assert [r["startup_s"] for r in pic["per_round"]] == [1.0, 3.0]
    prefix = results["configs"]["prefix"]
    assert prefix["ttft_vs_prefix_paired_median"] == 1.0
    assert prefix["ttft_vs_none_paired_median"] == pytest.approx(0.65)  # .8 .5; .8 .4


def test_the_report_states_the_pairing_and_the_spread(tmp_path: Path) -> None:
    results = paired_rounds()
    report = report_markdown(results)
    assert f"TTFT ratios paired within rounds (2 rounds; {PAIRING})" in report
    assert "| agentcache:pic | 0.65 (0.44-0.85; 0.25-1.00) | 0.40 (0.35-0.40; 0.20-0.40) | 4 |" in (
        report
    )
    assert (
        "Order: round 0: none, prefix, agentcache:pic; round 1: prefix, agentcache:pic, none"
        in (report)
    )
    assert "| session | turn | round | tokens | none | prefix | agentcache:pic |" in report
    assert "| s | 2 | 1 | 100 | 250 | 100 | 100 |" in report
    plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_run_records_its_provenance_keyed_by_configuration() -> None:
    from agentcache.bench.vllm.run import run_provenance
    from agentcache.workload.files import Session

    sessions = [
        Session("reflexion-08", "reflexion", "", ()),
        Session("memgpt-01", "memgpt", "", (), "tune"),
    ]
    prov = run_provenance(sessions, ["rpdc", "pic", "pic@vllm"])
    assert set(prov["specs"]) == {"agentcache:rpdc", "agentcache:pic", "agentcache:pic@vllm"}
    assert prov["specs"]["agentcache:rpdc"].startswith("rpdc:cover=")
    assert prov["specs"]["agentcache:pic@vllm"] == "pic"
    assert prov["split"] == "mixed" and prov["sessions"] == ["reflexion-08", "memgpt-01"]
    assert prov["commit"] and "dirty" in prov
    assert prov["command"].startswith("agentcache ")  # whatever the interpreter's path
