from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.harness import BenchRunner, parse_specs
from agentcache.model.loading import LoadedModel
from agentcache.prompt.registry import load_template
from agentcache.prompt.segments import SegmentKind
from agentcache.workload.files import load_workload

SHIPPED = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads" / "templated.jsonl"
BLOCKS = [{"label": "human", "value": "Name: Dana"}]


def memgpt_session(**turn_inputs: Any) -> dict[str, Any]:
    first = {"last_modified": "t0", "blocks": BLOCKS, "reply_prefix": "I"}
    msg = {"index": 0, "role": "user", "content": "hi"}
    second = {**first, "last_modified": "t1", "new_messages": [msg], **turn_inputs}
    return {
        "name": "m", "template": "memgpt",
        "turns": [{"inputs": first, "max_new_tokens": 3}, {"inputs": second}],
    }  # fmt: skip


def write(tmp_path: Path, *sessions: object) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return path


def test_template_session_renders_through_the_template(tmp_path: Path) -> None:
    loaded = load_workload(write(tmp_path, memgpt_session()))
    assert loaded.problems == ()
    (session,) = loaded.sessions
    assert [t.max_new_tokens for t in session.turns] == [3, 32]
    raw = memgpt_session()["turns"][1]["inputs"]
    assert session.turns[1].prompt == load_template("memgpt").render(raw)
    assert [s.id for s in session.turns[1].prompt.segments] == ["sys", "memory", "msg-0", "reply"]


def test_session_inputs_are_defaults_under_each_turns(tmp_path: Path) -> None:
    session = {
        "name": "s", "template": "swe_agent", "inputs": {"task": "fix it", "steps_left": 9},
        "turns": [{"inputs": {}}, {"inputs": {"steps_left": 8}}],
    }  # fmt: skip
    (s,) = load_workload(write(tmp_path, session)).sessions
    states = [next(x.text for x in t.prompt.segments if x.id == "state") for t in s.turns]
    assert states[0].endswith("(Steps left: 9)") and states[1].endswith("(Steps left: 8)")
    assert s.turns[0].prompt.segments[1].kind == SegmentKind.FIXED  # the instance


def test_bad_template_sessions_are_reported_with_line_numbers(tmp_path: Path) -> None:
    unknown = {**memgpt_session(), "template": "memgtp"}
    bad_inputs = memgpt_session(blocks=[])
    typo = memgpt_session(new_mesages=[])
    with_segments = {**memgpt_session(), "turns": [{"segments": [{"kind": "update", "text": "x"}]}]}
    bad_defaults = {**memgpt_session(), "inputs": ["not", "an", "object"]}
    path = write(tmp_path, memgpt_session(), unknown, bad_inputs, typo, with_segments, bad_defaults)
    loaded = load_workload(path)
    assert [s.name for s in loaded.sessions] == ["m"]
    p = loaded.problems
    assert len(p) == 5
    assert ":2: unknown template 'memgtp'; known: memgpt, reflexion, swe_agent" in p[0]
    assert ":3: turn 1: template 'memgpt' inputs: blocks: List should have at least 1" in p[1]
    assert ":4: turn 1: template 'memgpt' inputs: new_mesages: Extra inputs" in p[2]
    assert ":5: turn 0: template 'memgpt': needs an 'inputs' object, not segments" in p[3]
    assert ":6: session 'inputs' must be an object" in p[4]


def test_shipped_templated_workload_loads_and_runs(tiny: LoadedModel) -> None:
    loaded = load_workload(SHIPPED)
    assert loaded.problems == ()
    names = [s.name for s in loaded.sessions]
    assert names == ["templated-reflexion", "templated-memgpt", "templated-swe_agent"]
    for s in loaded.sessions:
        assert len(s.turns) == 4
        assert all(t.prompt.segments[-1].role == "assistant" for t in s.turns)  # mid-sentence
    swe = replace(loaded.sessions[2], turns=loaded.sessions[2].turns[:2])
    seen: list[str] = []
    records = BenchRunner(tiny, parse_specs("prefix"), kv_pages=256).run_session(swe, seen.append)
    assert len(records) == len(seen) == 4  # full and prefix, two turns each
    assert records[-1]["prompt_tokens"] > records[0]["prompt_tokens"]
    assert records[-1]["strategy"] == "prefix" and records[-1]["reused_tokens"] > 0
