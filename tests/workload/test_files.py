"""Workload files: splits, bad lines (reported with their line number and skipped), and the
committed files' tuning and validation halves."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentcache.bench.cli import select
from agentcache.errors import AgentCacheError, ConfigError
from agentcache.workload.files import load_workload
from tests.bench.reuse.test_bench import turn
from tests.bench.scripts import BENCHMARKS

FAMILIES = ("reflexion", "memgpt", "swe_agent", "chat")


def session(name: str, **fields: Any) -> str:
    return json.dumps({"name": name, "turns": [turn("x"), turn("y")], **fields})


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_splits_are_read_and_a_session_without_one_is_for_validation(tmp_path: Path) -> None:
    path = write(tmp_path / "w.jsonl", session("a", split="tune"), session("b"),
                 session("c", split="validate"))  # fmt: skip
    assert [(s.name, s.split) for s in load_workload(path).sessions] == [
        ("a", "tune"), ("b", "validate"), ("c", "validate")
    ]  # fmt: skip


def test_an_unknown_split_skips_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "w.jsonl", session("a"), session("b", split="train"))
    loaded = load_workload(path)
    assert [s.name for s in loaded.sessions] == ["a"]
    assert loaded.problems == (
        f"{path}:2: split must be one of tune, validate, got 'train'; skipped",
    )


def test_a_line_nested_too_deeply_is_skipped_and_the_file_still_runs(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    path = write(tmp_path / "w.jsonl", session("a"), deep, session("b"))
    loaded = load_workload(path)
    assert [s.name for s in loaded.sessions] == ["a", "b"]
    assert loaded.problems == (f"{path}:2: JSON nested too deeply; skipped",)


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ([], "has no valid session (it is empty)"),
        (["", "  "], "has no valid session (it is empty)"),
        (["{oops", "[]"], "has no valid session (2 lines skipped: "),
    ],
)
def test_a_file_with_no_valid_session_is_an_error(
    tmp_path: Path, lines: list[str], needle: str
) -> None:
    path = write(tmp_path / "w.jsonl", *lines)
    with pytest.raises(AgentCacheError) as e:
        load_workload(path)
    assert f"workload file {path} " in str(e.value) and needle in str(e.value)


def args(paths: list[Path], **kw: Any) -> argparse.Namespace:
    base = {"sessions": None, "case": None, "max_sessions": None, "max_turns": None,
            "new_tokens": None, "split": None}  # fmt: skip
    return argparse.Namespace(workloads=paths, **(base | kw))


@pytest.mark.parametrize(
    ("split", "sessions", "names"),
    [
        (None, None, ["b", "c"]),  # the validation half by default
        ("validate", None, ["b", "c"]),
        ("tune", None, ["a"]),
        ("all", None, ["a", "b", "c"]),
        (None, "a,c", ["a", "c"]),  # named sessions, whatever their split
        ("validate", "b,c", ["b", "c"]),
    ],
)
def test_bench_selects_the_split(
    tmp_path: Path, split: str | None, sessions: str | None, names: list[str]
) -> None:
    path = write(tmp_path / "w.jsonl", session("a", split="tune"), session("b"),
                 session("c", split="validate"))  # fmt: skip
    chosen, _ = select(args([path], split=split, sessions=sessions), Console(quiet=True))
    assert [s.name for s in chosen] == names


def test_a_split_the_files_do_not_hold_is_a_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "w.jsonl", session("a"))
    with pytest.raises(ConfigError, match="--split tune: no session of that split; the files "
                       "hold validate"):  # fmt: skip
        select(args([path], split="tune"), Console(quiet=True))
    other = write(tmp_path / "v.jsonl", session("a"), session("t", split="tune"))
    with pytest.raises(ConfigError, match="matches --split tune and --sessions a"):
        select(args([other], split="tune", sessions="a"), Console(quiet=True))


def committed(family: str) -> list[dict[str, Any]]:
    text = (BENCHMARKS / "workloads" / f"{family}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_has_tuning_and_validation_halves(family: str) -> None:
    sessions = load_workload(BENCHMARKS / "workloads" / f"{family}.jsonl").sessions
    cases = {s.case for s in sessions}
    assert len(cases) == 2
    for split in ("tune", "validate"):
        half = [s for s in sessions if s.split == split]
        assert len(half) >= 4 and all(len(s.turns) >= 6 for s in half), split
        assert {s.case for s in half} == cases, split


@pytest.mark.parametrize("family", ("reflexion", "memgpt", "swe_agent"))
def test_the_tuning_sessions_keep_their_names(family: str) -> None:
    tune = [s["name"] for s in committed(family) if s["split"] == "tune"]
    assert tune == [f"{family}-{i:02d}" for i in range(8)]


def test_skipped_lines_are_printed_as_warnings_and_counted(tmp_path: Path) -> None:
    path = write(tmp_path / "w.jsonl", "{oops", session("a"), "[" * 5000 + "]" * 5000)
    out = io.StringIO()
    chosen, problems = select(args([path]), Console(file=out, width=400))
    assert [s.name for s in chosen] == ["a"] and len(problems) == 2
    printed = out.getvalue()
    assert f"warning: {path}:1: not valid JSON" in printed
    assert f"warning: {path}:3: JSON nested too deeply; skipped" in printed
    assert "warning: 2 workload lines skipped" in printed
