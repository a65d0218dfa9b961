"""Workload files: JSON Lines, one agent session per line (format in docs/benchmarks.md).

A session gives each turn's segments, or names a shipped template and gives each turn's inputs
(docs/templates.md); session-level `inputs` are defaults under every turn's. A bad line
(invalid JSON, unknown segment kind or template, inputs the template rejects, missing fields)
is reported with its line number and skipped; the rest of the file still runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentcache.errors import AgentCacheError, PromptError
from agentcache.prompt.registry import load_template
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.prompt.template import PromptTemplate


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
    template = _template(obj)
    turns = []
    for i, t in enumerate(obj["turns"]):
        try:
            prompt = _prompt(t, template, obj.get("inputs", {}))
        except PromptError as e:
            raise PromptError(f"turn {i}: {e}") from e
        turns.append(Turn(prompt, _max_new_tokens(t, i)))
    return Session(
        str(obj.get("name", default_name)),
        str(obj.get("workload", workload)),
        str(obj.get("case", "")),
        tuple(turns),
    )


def _max_new_tokens(turn: dict[str, Any], index: int) -> int:
    n = turn.get("max_new_tokens", 32)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise PromptError(f"turn {index}: max_new_tokens must be an integer >= 0, got {n!r}")
    return n


def _template(obj: dict[str, Any]) -> PromptTemplate[Any] | None:
    if "template" not in obj:
        return None
    if not isinstance(obj.get("inputs", {}), dict):
        raise PromptError("session 'inputs' must be an object")
    try:
        return load_template(str(obj["template"]))
    except PromptError:
        raise
    except AgentCacheError as e:  # an unknown name: the message lists the known ones
        raise PromptError(str(e)) from e


def _prompt(
    turn: Any, template: PromptTemplate[Any] | None, defaults: dict[str, Any]
) -> SegmentedPrompt:
    if not isinstance(turn, dict):
        raise PromptError("a turn must be an object")
    if template is None:
        segments = turn.get("segments")
        if not isinstance(segments, list):
            raise PromptError("needs a 'segments' list (or name a template and give 'inputs')")
        for i, segment in enumerate(segments):
            if not isinstance(segment, dict):
                raise PromptError(f"segment {i} must be an object, got {type(segment).__name__}")
        return SegmentedPrompt.from_dicts(segments)
    if "segments" in turn or not isinstance(turn.get("inputs"), dict):
        raise PromptError(f"template {template.name!r}: needs an 'inputs' object, not segments")
    try:
        return template.render({**defaults, **turn["inputs"]})
    except ValidationError as e:
        raise PromptError(f"template {template.name!r} inputs: {_errors(e)}") from e


def _errors(e: ValidationError) -> str:
    """pydantic's errors on one line: `field.sub: message; ...`."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'inputs'}: {err['msg']}" for err in e.errors()
    )


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of `path`; AgentCacheError naming `what` and the problem otherwise."""
    if path.is_dir():
        raise AgentCacheError(f"{what} {path} is a folder, not a file")
    if not path.exists():
        raise AgentCacheError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise AgentCacheError(f"{what} {path} cannot be read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise AgentCacheError(
            f"{what} {path} is not UTF-8 text (byte {e.start} cannot be decoded)"
        ) from e


def load_workload(path: Path) -> LoadedWorkload:
    sessions, problems = [], []
    text = read_text(path, "workload file")
    for lineno, line in enumerate(text.splitlines(), start=1):
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
