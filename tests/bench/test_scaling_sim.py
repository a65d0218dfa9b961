from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def scaling_sim() -> ModuleType:
    path = ROOT / "benchmarks/scaling_sim.py"
    spec = importlib.util.spec_from_file_location("scaling_sim", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_replay_reads_the_bench_sessions_only() -> None:
    """templated.jsonl (template inputs, no segments) shares the folder and is left out."""
    sessions = scaling_sim().load_sessions(tokenize=False)
    assert len(sessions) == 24
    assert sum(len(turns) for _, turns in sessions) == 144
    assert {name.rsplit("-", 1)[0] for name, _ in sessions} == {"memgpt", "reflexion", "swe_agent"}
