"""The committed chat edit families and generated.jsonl: halves, turns, declared edits, and
rebuilds that are byte-identical to them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentcache.bench.reuse.edit_families import FAMILIES
from agentcache.bench.reuse.generate import check_generated
from agentcache.workload.edits import check_edits
from agentcache.workload.files import load_workload
from tests.bench.scripts import BENCHMARKS

WORKLOADS = BENCHMARKS / "workloads"


def lines(name: str) -> list[dict[str, Any]]:
    text = (WORKLOADS / f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_edit_family_has_halves_of_warm_sessions(family: str) -> None:
    loaded = load_workload(WORKLOADS / f"{family}.jsonl")  # through the server's segmenter
    assert loaded.problems == ()
    for split in ("tune", "validate"):
        half = [s for s in loaded.sessions if s.split == split]
        assert len(half) >= 4 and all(len(s.turns) >= 6 for s in half), split  # >= 5 warm
        assert {s.case for s in half} == set(FAMILIES[family].modes), split


@pytest.mark.parametrize("family", FAMILIES)
def test_each_session_makes_the_edits_its_family_declares(family: str) -> None:
    sources: dict[str, set[str]] = {"tune": set(), "validate": set()}
    for sess in lines(family):
        assert sess["edits"] == list(FAMILIES[family].edits)
        kinds = {e.kind for e in check_edits(sess)}
        assert set(sess["edits"]) <= kinds, sess["name"]
        assert all(t["messages"][-1]["role"] in ("user", "tool") for t in sess["turns"])
        sources[sess["split"]].add(sess["source"])
    assert not sources["tune"] & sources["validate"]  # no bfcl case in both halves


def test_chat_jsonl_still_only_appends() -> None:
    for sess in lines("chat"):
        assert "edits" not in sess
        assert {e.kind for e in check_edits(sess)} == {"start", "append"}, sess["name"]


def test_generated_sessions_vary_in_structure_across_both_halves() -> None:
    sessions = lines("generated")
    assert load_workload(WORKLOADS / "generated.jsonl").problems == ()
    for split in ("tune", "validate"):
        half = [s for s in sessions if s["split"] == split]
        assert len(half) == 16 and all(len(s["turns"]) == 6 for s in half)
        assert {s["case"] for s in half} == {"swing", "shift"}
        shapes = [s["structure"] for s in half]
        assert {x["head_blocks"] for x in shapes} == {1, 2, 3}
        assert {x["mid_block"] is None for x in shapes} == {True, False}
        assert {x["tail_block"] for x in shapes} == {True, False}
        assert len({x["prefilled"] for x in shapes}) >= 4
    seeds = {
        s["split"]: {x["seed"] for x in sessions if x["split"] == s["split"]} for s in sessions
    }
    assert not seeds["tune"] & seeds["validate"]
    for sess in sessions:
        check_generated(sess, lambda text: len(text.split()))  # raises on a broken session


def rebuild(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "workloads" / script), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def test_the_chat_edit_build_is_the_committed_files(tmp_path: Path) -> None:
    run = rebuild("build_chat_edits.py", tmp_path)
    assert run.returncode == 0, run.stderr
    for family in FAMILIES:
        built = (tmp_path / f"{family}.jsonl").read_bytes()
        assert built == (WORKLOADS / f"{family}.jsonl").read_bytes(), family


def test_the_generated_build_is_the_committed_file(tmp_path: Path) -> None:
    run = rebuild("build_generated.py", tmp_path / "generated.jsonl")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "generated.jsonl").read_bytes() == (
        WORKLOADS / "generated.jsonl"
    ).read_bytes()
