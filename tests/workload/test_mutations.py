"""Hostile workload lines found by mutation: lines of the shipped workload files, each changed
in one to three places (a value swapped for one of another type, size or encoding; a key
dropped or added; a list grown or shuffled; text cut short or given a stray marker). Every
line of such a file is a session or a named, skipped problem: nothing raises out of
`load_workload` (a KeyError in the edit check once did). The seeded run is the same on every
machine."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from agentcache.workload.files import load_workload
from tests.mutation import pick

WORKLOADS = Path(__file__).parents[2] / "benchmarks" / "workloads"
VALUES: list[Any] = [None, True, 0, -1, 1.5, 10**30, "", "x", "\x00", "é" * 3, [], {}, [None],
                     {"a": None}, "system", "fixed", "tool", "assistant", "user", "tune",
                     [{"role": "user", "content": "hi"}],
                     {"type": "text", "text": "t"}]  # fmt: skip
KEYS = ["kind", "text", "id", "role", "segments", "messages", "tools", "edits", "inputs",
        "template", "split", "max_new_tokens", "tool_calls", "content", "name", "reply",
        "thread", "tool_call_id"]  # fmt: skip
TAILS = ["", "\x00", "{{", "{% segment 'x' %}", "<|im_end|>"]


def seeds() -> list[dict[str, Any]]:
    out = []
    for f in sorted(WORKLOADS.glob("*.jsonl")):
        lines = [ln for ln in f.read_text().splitlines() if ln.strip()]
        out += [json.loads(ln) for ln in lines[:2]]
    return out


def mutate(obj: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    o = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 3)):
        parent, key, op = pick(o, rng)
        if op < 0.45:
            parent[key] = copy.deepcopy(rng.choice(VALUES))
        elif op < 0.6:
            del parent[key]
        elif op < 0.7 and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = copy.deepcopy(rng.choice(VALUES))
        elif op < 0.8 and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op < 0.9 and isinstance(parent, list):
            rng.shuffle(parent)
        elif isinstance(value := parent[key], str):
            parent[key] = value[: rng.randint(0, len(value))] + rng.choice(TAILS)
    return o


def test_every_mutated_line_is_a_session_or_a_named_problem(tmp_path: Path) -> None:
    rng = random.Random(20261208)
    base = seeds()
    assert len(base) >= 20  # two lines of each shipped file
    lines = [json.dumps(mutate(rng.choice(base), rng)) for _ in range(1500)]
    path = tmp_path / "mutated.jsonl"
    path.write_text("\n".join(lines) + "\n")
    loaded = load_workload(path)
    assert len(loaded.sessions) + len(loaded.problems) == len(lines)
    # the mutations reach both sides: lines still loaded and lines refused
    assert len(loaded.sessions) >= 100 and len(loaded.problems) >= 300
    assert all(p.startswith(f"{path}:") and p.endswith("; skipped") for p in loaded.problems)
