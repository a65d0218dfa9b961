"""benchmarks/reuse/exact_history.py on the tiny model: the default on a store of its own and on
a store of full recompute's K/V, turn by turn, against `full` on the same engine."""

from __future__ import annotations

from typing import Any

from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.workload.files import Session, parse_session
from tests.bench.scripts import load_script

exact_history = load_script("reuse/exact_history")


def session(memory: list[str]) -> Session:
    """A chat whose system message holds `memory[i]` on turn i, the history growing by one
    exchange a turn (each turn's reply is the next request's assistant message)."""
    turns: list[dict[str, Any]] = []
    history: list[dict[str, str]] = []
    for i, m in enumerate(memory):
        history.append({"role": "user", "content": f"Question {i}: list the files in folder f{i}."})
        system = {"role": "system", "content": f"You are an agent. <memory>{m}</memory>"}
        turns.append({"messages": [system, *history]})
        history.append({"role": "assistant", "content": f"Folder f{i} holds a.txt and b.txt."})
    obj = {"name": "s-00", "workload": "test", "case": "memory", "split": "tune", "turns": turns}
    return parse_session(obj, "s-00", "test")


def engines(tiny: LoadedModel) -> dict[str, Engine]:
    return {
        "own": Engine(tiny),
        "exact": Engine(tiny, EngineConfig(strategy_options=exact_history.EVERY_TOKEN)),
    }


def test_an_unchanged_prompt_agrees_with_full_on_both_stores(tiny: LoadedModel) -> None:
    rows = exact_history.run_session(engines(tiny), session(["same"] * 3), 4)
    assert [r["turn"] for r in rows] == [0, 1, 2]
    assert "own_greedy_equal" not in rows[0]  # nothing stored before the first turn
    for r in rows[1:]:
        assert r["own_greedy_equal"] and r["exact_greedy_equal"]
        assert r["own_first_equal"] and r["exact_first_equal"]


def test_a_changed_memory_runs_both_stores_and_reports_each_warm_turn(tiny: LoadedModel) -> None:
    memory = ["task log: none", "task log: listed f0 and found two files", "task log: f0, f1"]
    rows = exact_history.run_session(engines(tiny), session(memory), 4)
    warm = rows[1:]
    for r in warm:
        assert isinstance(r["own_greedy_equal"], bool) and isinstance(r["exact_greedy_equal"], bool)
        assert 0 < r["own_recomputed"] <= r["prompt_tokens"]
        assert 0 < r["exact_recomputed"] <= r["prompt_tokens"]
    report = exact_history.render({"provenance": PROVENANCE, "turns": rows})
    assert report.count("| s-00 |") == len(warm)
    assert f"of {len(warm)} warm turns" in report


PROVENANCE = {
    "command": "python benchmarks/reuse/exact_history.py",
    "commit": "0" * 40,
    "date": "2026-12-07T00:00:00+00:00",
    "machine": {"cores": 2, "torch_threads": 1},
}
