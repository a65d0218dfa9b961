"""How each request of a chat session differs from the one before it, and which edits a
session allows.

A session's turns form threads (`"thread"`, default `main`; a subagent is a thread of its
own). Each turn is compared with its thread's previous request plus that request's reply
(`"reply"`, or the message the next request holds right after it):

    previous + reply:  [sys][u1][a1][t1][u2][a2][t2]
    append:            [sys][u1][a1][t1][u2][a2][t2][u3]            grows at the end only
    system:            [SYS'][u1][a1][t1][u2][a2][t2][u3]           leading system text changed
    clear:             [sys][u1][a1][T1'][u2][a2][t2][u3]           a tool result's text replaced
    compact:           [sys][summary][u2][a2][t2][u3]               a span -> one message
    retry:             [sys][u1][a1][t1][U2']                       reply dropped, last re-sent
    fork:              a thread's first request, with the system messages and tools of an
                       earlier request and at least one of its other messages verbatim

`start` (the session's first request) and `append` are always allowed; a session names the
other kinds it allows in `"edits"`. `chat.jsonl` names none: every request extends the
previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentcache.errors import PromptError

EDIT_KINDS = ("start", "append", "system", "clear", "compact", "retry", "fork")
ALWAYS = ("start", "append")
Message = dict[str, Any]


@dataclass(frozen=True)
class TurnEdit:
    turn: int
    thread: str
    kind: str
    # indices, in the thread's previous request + reply, of the messages this request
    # changed or dropped (empty for start, append and fork)
    changed: tuple[int, ...]


def classify(turns: Sequence[dict[str, Any]]) -> list[TurnEdit]:
    """Each turn's edit; PromptError naming the turn when a request fits no kind."""
    last: dict[str, tuple[list[Message], list[Message]]] = {}  # thread -> (messages, + reply)
    earlier: list[dict[str, Any]] = []
    out = []
    for i, turn in enumerate(turns):
        thread = str(turn.get("thread", "main"))
        msgs = list(turn["messages"])
        if thread in last:
            kind, changed = _edit(*last[thread], msgs)
        elif earlier:
            kind, changed = _fork(earlier, turn), ()
        else:
            kind, changed = "start", ()
        if kind == "":
            raise PromptError(f"turn {i} ({thread}): the request is no edit of its previous one")
        out.append(TurnEdit(i, thread, kind, changed))
        last[thread] = (msgs, [*msgs, r] if (r := _reply(turns, i)) is not None else msgs)
        earlier.append(turn)
    return out


def check_edits(session: dict[str, Any]) -> list[TurnEdit]:
    """The session's edits, each of a kind it allows; PromptError naming the first that is not."""
    allowed = session.get("edits", [])
    if not isinstance(allowed, list) or not all(isinstance(k, str) for k in allowed):
        raise PromptError(f"{session.get('name')}: 'edits' must be a list of edit kinds")
    unknown = sorted(set(allowed) - set(EDIT_KINDS))
    if unknown:
        raise PromptError(
            f"{session.get('name')}: unknown edit kinds {unknown}; known: {', '.join(EDIT_KINDS)}"
        )
    edits = classify(session["turns"])
    for e in edits:
        if e.kind not in (*ALWAYS, *allowed):
            raise PromptError(
                f"{session.get('name')}: turn {e.turn} ({e.thread}) is a {e.kind} edit; the "
                f"session allows {', '.join((*ALWAYS, *allowed))}"
            )
    return edits


def _reply(turns: Sequence[dict[str, Any]], i: int) -> Message | None:
    """As workload.chat reads it: the turn's `reply`, else the next request's message
    right after this one's, when it is the assistant's."""
    if "reply" in turns[i]:
        reply: Message | None = turns[i]["reply"]
        return reply
    if i + 1 == len(turns):
        return None
    n, following = len(turns[i]["messages"]), turns[i + 1]["messages"]
    return following[n] if len(following) > n and following[n]["role"] == "assistant" else None


def _edit(
    prev: list[Message], base: list[Message], cur: list[Message]
) -> tuple[str, tuple[int, ...]]:
    n = len(base)
    if len(cur) > n and cur[:n] == base:
        return "append", ()
    if len(cur) == len(prev) and cur[:-1] == prev[:-1] and cur[-1]["role"] == prev[-1]["role"]:
        return "retry", (len(prev) - 1,) if cur[-1] != prev[-1] else ()
    if len(cur) > n:
        differ = [j for j in range(n) if cur[j] != base[j]]
        if all(j < _n_leading(base) and _is_system(cur[j]) for j in differ):
            return "system", tuple(differ)
        if all(_cleared(base[j], cur[j]) for j in differ):
            return "clear", tuple(differ)
    return _compact(base, cur)


def _compact(base: list[Message], cur: list[Message]) -> tuple[str, tuple[int, ...]]:
    """A span base[i:j] (two messages or more, after the leading system messages) replaced by
    the one message cur[i]; the rest of base follows it verbatim, then what the turn appends."""
    i = next((k for k, (a, b) in enumerate(zip(base, cur, strict=False)) if a != b), None)
    if i is None or i < _n_leading(base) or _is_system(cur[i]):
        return "", ()
    n = len(base)
    for j in range(i + 2, n + 1):
        tail = base[j:]
        if cur[i + 1 : i + 1 + len(tail)] == tail and len(cur) > i + 1 + len(tail):
            return "compact", tuple(range(i, j))
    return "", ()


def _fork(earlier: list[dict[str, Any]], turn: dict[str, Any]) -> str:
    msgs = turn["messages"]
    system = [m for m in msgs if _is_system(m)]
    rest = [m for m in msgs if not _is_system(m)]
    for other in earlier:
        theirs = other["messages"]
        same_prefix = [m for m in theirs if _is_system(m)] == system
        same_tools = other.get("tools", []) == turn.get("tools", [])
        if same_prefix and same_tools and any(m in theirs for m in rest):
            return "fork"
    return ""


def _is_system(m: Message) -> bool:
    return m["role"] in ("system", "developer")


def _n_leading(msgs: list[Message]) -> int:
    return next((k for k, m in enumerate(msgs) if not _is_system(m)), len(msgs))


def _cleared(old: Message, new: Message) -> bool:
    """A tool result whose text was replaced (a placeholder, a trimmed copy), its call kept."""
    same_call = old.get("tool_call_id") == new.get("tool_call_id")
    return (
        old["role"] == new["role"] == "tool"
        and same_call
        and old.get("content") != new.get("content")
    )
