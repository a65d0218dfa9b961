"""Workload files: JSON Lines, one agent session per line (format in docs/benchmarks.md).

A session gives each turn's segments, or names a shipped template and gives each turn's inputs
(docs/templates.md); session-level `inputs` are defaults under every turn's; or gives each
turn's OpenAI-style `messages` (+ `tools`), which the server's segmenter turns into segments
(workload/chat.py); a chat session that lists the edits its requests make (`edits`,
workload/edits.py) must make no other. `split` reserves a session for tuning (`tune`) or
reporting (`validate`); a session without one is a validation session: nothing was tuned on it.

A bad line (invalid or too deeply nested JSON, unknown segment kind or template, inputs the
template rejects, messages the segmenter rejects, an undeclared edit, missing fields) is
reported with its line number and skipped; the rest of the file still runs. A file with no
valid session is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentcache.errors import AgentCacheError, PromptError
from agentcache.prompt.registry import load_template
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.template import PromptTemplate
from agentcache.workload.chat import chat_turns, is_chat
from agentcache.workload.edits import check_edits

SPLITS = ("tune", "validate")


@dataclass(frozen=True)
class Turn:
    prompt: SegmentedPrompt
    max_new_tokens: int
    # chat sessions: the segment the reply becomes in the next request, whose KV the server
    # stores as it generates the reply (None: no reply follows, or not a chat session)
    reply: Segment | None = None


@dataclass(frozen=True)
class Session:
    name: str
    workload: str
    case: str  # "swing" | "shift" | "" (unlabelled) | a chat session's kind
    turns: tuple[Turn, ...]
    split: str = "validate"  # "tune" | "validate"


@dataclass(frozen=True)
class LoadedWorkload:
    sessions: tuple[Session, ...]
    problems: tuple[str, ...]  # "file:line: what is wrong", for skipped lines


def parse_session(obj: Any, default_name: str, workload: str) -> Session:
    if not isinstance(obj, dict) or not isinstance(obj.get("turns"), list) or not obj["turns"]:
        raise PromptError("a session needs a non-empty 'turns' list")
    if is_chat(obj["turns"]):
        prompts = chat_turns(obj["turns"])
        if "edits" in obj:  # the session declares how its requests may differ
            check_edits(obj)
    else:
        prompts = _segment_turns(obj["turns"], _template(obj), obj.get("inputs", {}))
    turns = [
        Turn(prompt, _max_new_tokens(t, i), reply)
        for i, (t, (prompt, reply)) in enumerate(zip(obj["turns"], prompts, strict=True))
    ]
    return Session(
        str(obj.get("name", default_name)),
        str(obj.get("workload", workload)),
        str(obj.get("case", "")),
        tuple(turns),
        _split(obj),
    )


def _segment_turns(
    turns: list[Any], template: PromptTemplate[Any] | None, defaults: dict[str, Any]
) -> list[tuple[SegmentedPrompt, Segment | None]]:
    out: list[tuple[SegmentedPrompt, Segment | None]] = []
    for i, t in enumerate(turns):
        try:
            out.append((_prompt(t, template, defaults), None))
        except PromptError as e:
            raise PromptError(f"turn {i}: {e}") from e
    return out


def _split(obj: dict[str, Any]) -> str:
    split = obj.get("split", "validate")
    if split not in SPLITS:
        raise PromptError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return str(split)


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
    """The file's valid sessions and its skipped lines; AgentCacheError when none is valid."""
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
        except RecursionError:  # json's parser (or a check after it) ran out of stack
            problems.append(f"{path}:{lineno}: JSON nested too deeply; skipped")
        except (PromptError, ValueError, TypeError) as e:
            problems.append(f"{path}:{lineno}: {e}; skipped")
    if not sessions:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise AgentCacheError(
            f"workload file {path} has no valid session"
            + (f" ({len(problems)} lines skipped: {shown})" if problems else " (it is empty)")
        )
    return LoadedWorkload(tuple(sessions), tuple(problems))
