"""benchmarks/workloads/build_workloads.py: the committed workloads are what it builds, and --turns
builds longer sessions of the same agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import BENCHMARKS

SCRIPT = BENCHMARKS / "workloads" / "build_workloads.py"


def build(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # the chat family is checked with this checkout's segmenter, not an installed copy's
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def sessions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_default_build_is_the_committed_workloads(tmp_path: Path) -> None:
    run = build(tmp_path)
    assert run.returncode == 0, run.stderr
    for name in ("reflexion", "memgpt", "swe_agent", "chat"):
        built = (tmp_path / f"{name}.jsonl").read_bytes()
        assert built == (BENCHMARKS / "workloads" / f"{name}.jsonl").read_bytes(), name


def test_longer_sessions_extend_the_default_ones(tmp_path: Path) -> None:
    run = build(tmp_path, "--turns", "9")
    assert run.returncode == 0, run.stderr
    assert "swe_agent skipped" in run.stdout  # its sessions have 8 steps at most
    assert "chat skipped" in run.stdout  # one tool call a turn; its cases have 8 at least
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memgpt.jsonl", "reflexion.jsonl"]
    for name in ("reflexion", "memgpt"):
        long = sessions(tmp_path / f"{name}.jsonl")
        assert len(long) == 16 and all(len(s["turns"]) == 9 for s in long), name
    default = sessions(BENCHMARKS / "workloads" / "memgpt.jsonl")
    long = sessions(tmp_path / "memgpt.jsonl")
    for short, longer in zip(default, long, strict=True):  # the same chats, turn for turn
        assert short["name"] == longer["name"]
        assert short["turns"] == longer["turns"][:6]
        ids = [s["id"] for s in longer["turns"][8]["segments"]]
        assert ids.count("reply") == 1 and f"msg-{20 + 2 * 8}" in ids  # turn 8's user message


@pytest.mark.parametrize("turns", ["1", "0"])
def test_fewer_than_two_turns_is_an_error(tmp_path: Path, turns: str) -> None:
    run = build(tmp_path, "--turns", turns)
    assert run.returncode != 0 and "--turns must be at least 2" in run.stderr
    assert not any(tmp_path.iterdir())


def test_only_builds_the_named_workloads(tmp_path: Path) -> None:
    run = build(tmp_path, "--only", "swe_agent")
    assert run.returncode == 0, run.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["swe_agent.jsonl"]
    built = (tmp_path / "swe_agent.jsonl").read_bytes()
    assert built == (BENCHMARKS / "workloads" / "swe_agent.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("only", "message"),
    [("reflexion,bogus", "unknown workload(s) bogus"), (",", "(none given)")],
)
def test_only_with_an_unknown_workload_is_an_error(tmp_path: Path, only: str, message: str) -> None:
    run = build(tmp_path, "--only", only)
    assert run.returncode != 0 and message in run.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("turns", ["8", "9"])
def test_only_swe_agent_past_its_steps_builds_nothing(tmp_path: Path, turns: str) -> None:
    # the shortest case has 8 steps: 8 turns would leave its first turn with no history
    run = build(tmp_path, "--turns", turns, "--only", "swe_agent")
    assert run.returncode != 0 and "nothing to build" in run.stderr
    assert "at most 7 turns" in run.stdout
    assert not any(tmp_path.iterdir())


def test_a_session_whose_memory_stops_growing_is_a_clear_error(tmp_path: Path) -> None:
    # memgpt's shift sessions add one fact per turn; the notetaker scenario has 24
    run = build(tmp_path, "--turns", "20", "--only", "memgpt")
    assert run.returncode != 0
    assert "memgpt-03 (shift)" in run.stderr and "memory stops growing" in run.stderr
    assert not any(tmp_path.iterdir())
