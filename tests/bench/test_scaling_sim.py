from __future__ import annotations

from tests.bench.scripts import load_script


def test_replay_reads_the_bench_sessions_only() -> None:
    """templated.jsonl (template inputs, no segments) shares the folder and is left out."""
    sessions = load_script("scaling/sim").load_sessions(tokenize=False)
    assert len(sessions) == 24
    assert sum(len(turns) for _, turns in sessions) == 144
    assert {name.rsplit("-", 1)[0] for name, _ in sessions} == {"memgpt", "reflexion", "swe_agent"}
