"""Workload files: JSON Lines, one agent session per line (format in docs/benchmarks.md).

A bad line (invalid JSON, unknown segment kind, missing fields) is reported with its line
number and skipped; the rest of the file still runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcache.errors import AgentCacheError, PromptError
from agentcache.prompt.segments import SegmentedPrompt


@dataclass(frozen=True)
class Turn:
    prompt: SegmentedPrompt
    max_new_tokens: int


@dataclass(frozen=True)
class Session:
    name: str
    workload: str
    case: str  # "swing" | "shift" | "" (unlabelled)
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class LoadedWorkload:
    sessions: tuple[Session, ...]
    problems: tuple[str, ...]  # "file:line: what is wrong", for skipped lines


def parse_session(obj: Any, default_name: str, workload: str) -> Session:
    if not isinstance(obj, dict) or not isinstance(obj.get("turns"), list) or not obj["turns"]:
        raise PromptError("a session needs a non-empty 'turns' list")
    if "template" in obj:
        raise PromptError(
            "template-named sessions are not supported by this version; give segments"
        )
    turns = []
    for i, t in enumerate(obj["turns"]):
        if not isinstance(t, dict) or not isinstance(t.get("segments"), list):
            raise PromptError(f"turn {i} needs a 'segments' list")
        try:
            prompt = SegmentedPrompt.from_dicts(t["segments"])
        except PromptError as e:
            raise PromptError(f"turn {i}: {e}") from e
        turns.append(Turn(prompt, int(t.get("max_new_tokens", 32))))
    return Session(
        str(obj.get("name", default_name)),
        str(obj.get("workload", workload)),
        str(obj.get("case", "")),
        tuple(turns),
    )


def load_workload(path: Path) -> LoadedWorkload:
    if not path.is_file():
        raise AgentCacheError(f"workload file {path} does not exist")
    sessions, problems = [], []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            sessions.append(parse_session(obj, f"{path.stem}-{lineno}", path.stem))
        except json.JSONDecodeError as e:
            problems.append(f"{path}:{lineno}: not valid JSON ({e.msg}); skipped")
        except (PromptError, ValueError, TypeError) as e:
            problems.append(f"{path}:{lineno}: {e}; skipped")
    return LoadedWorkload(tuple(sessions), tuple(problems))
