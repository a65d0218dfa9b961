"""Chat sessions whose history an agent framework edits, made from one tool-use conversation.

A `ToolConversation` is a solved tool-use task: the user's requests, the assistant's tool calls
and their results, in order; request s holds `body[:points[s]]` and its reply is the call
`body[points[s]]`. Each family below turns it into the requests a framework would send
(agentcache.workload.edits names the edit kinds):

    chat-sysprompt  system   memory: a MemGPT-style memory block (task log, environment state,
                             last-modified time) at the end of the system prompt, rewritten
                             every turn; clock: a current-time line there, new every turn
    chat-edit       clear    tool results older than the newest few replaced by a placeholder:
                             rolling (one more each turn, the newest 2 kept) or batch (once more
                             than 3 are uncleared, all but the newest)
    chat-compact    compact  older messages replaced by a summary message: once (one cut, at
                             the fourth turn) or rolling (every turn, the newest 4 kept)
    chat-retry      retry    a request re-sent after its reply was dropped: resend (identical)
                             or edit (first sent with an under-specified phrasing, then edited)
    chat-fork       fork     a user request handed to a subagent that shares the system prompt
                             and tools: fork (with the parent's history) or delegate (with the
                             parent's two newest tool exchanges, moved to the front); the
                             parent resumes with the subagent's report as the tool result

A family returns None when the conversation cannot carry its edit (too few calls, no
under-specified phrasing, no request with two calls to delegate).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

Message = dict[str, Any]
MAX_NEW_TOKENS = 32
WINDOW = 6  # requests per session, before retries and subagent requests are added
PLACEHOLDER = "[tool result cleared to save context]"
SUMMARY_HEAD = "Summary of the conversation so far (the messages it replaces were removed):"
START = datetime(2024, 9, 16, 9, 30)
SUBAGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "run_subagent",
        "description": "Hand one self-contained request to a subagent that has the same tools; "
        "it carries the request out and returns a report of the calls it made and their results.",
        "parameters": {
            "type": "object",
            "properties": {"task": {"type": "string", "description": "the request, in full"}},
            "required": ["task"],
        },
    },
}


@dataclass(frozen=True)
class ToolConversation:
    system: str
    tools: tuple[Message, ...]
    body: tuple[Message, ...]  # user / assistant (one tool call) / tool messages
    points: tuple[int, ...]  # request s holds body[:points[s]]; body[points[s]] is call s
    states: tuple[str, ...]  # the environment's state before call s
    # body index of a user message -> an earlier, under-specified phrasing of it
    variants: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    messages: tuple[Message, ...]
    tools: tuple[Message, ...]
    reply: Message | None
    thread: str = "main"

    def to_json(self) -> dict[str, Any]:
        out = {
            "messages": list(self.messages),
            "tools": list(self.tools),
            "max_new_tokens": MAX_NEW_TOKENS,
            "reply": self.reply,
        }
        return out | ({"thread": self.thread} if self.thread != "main" else {})


Build = Callable[[ToolConversation, str], "list[Request] | None"]


@dataclass(frozen=True)
class Family:
    edits: tuple[str, ...]  # the edit kinds its sessions make (chat_edits.EDIT_KINDS)
    modes: tuple[str, ...]  # its cases, alternating between sessions
    build: Build

    def make(self, conv: ToolConversation, mode: str) -> list[Request] | None:
        """The family's requests in `mode` (None: the conversation cannot carry them)."""
        if mode not in self.modes:
            raise ValueError(f"unknown case {mode!r}; expected one of {', '.join(self.modes)}")
        return self.build(conv, mode)


def _system(text: str) -> Message:
    return {"role": "system", "content": text}


def _window(conv: ToolConversation, n: int = WINDOW) -> range | None:
    return range(len(conv.points) - n, len(conv.points)) if len(conv.points) >= n else None


def _plain(conv: ToolConversation, s: int, system: str | None = None) -> Request:
    msgs = (_system(system or conv.system), *conv.body[: conv.points[s]])
    return Request(msgs, conv.tools, conv.body[conv.points[s]])


def clock(s: int) -> str:
    return (START + timedelta(seconds=263 * s + 11 * s * s)).strftime("%Y-%m-%d %H:%M:%S")


def _call_line(call: Message, result: Message | None) -> str:
    fn = call["tool_calls"][0]["function"]
    out = f"{fn['name']}({fn['arguments']})"
    return out + (f" -> {result['content'][:100]}" if result is not None else "")


def _calls(body: Sequence[Message]) -> list[tuple[Message, Message | None]]:
    """Each tool call of `body` with its result (None when the result is not in it)."""
    out = []
    for i, m in enumerate(body):
        if m["role"] == "assistant" and m.get("tool_calls"):
            nxt = body[i + 1] if i + 1 < len(body) and body[i + 1]["role"] == "tool" else None
            out.append((m, nxt))
    return out


# ----------------------------------------------------------------------------- sysprompt
def sysprompt(conv: ToolConversation, mode: str) -> list[Request] | None:
    if (window := _window(conv)) is None:
        return None
    out = []
    for s in window:
        if mode == "clock":
            tail = f"Current date and time: {clock(s)} (UTC)."
        else:
            log = "\n".join(
                f"- step {k + 1}: {_call_line(c, r)}"
                for k, (c, r) in enumerate(_calls(conv.body[: conv.points[s]]))
            )
            tail = (
                f'<memory last_modified="{clock(s)}">\n<task_log>\n{log}\n</task_log>\n'
                f"<environment>\n{conv.states[s]}\n</environment>\n</memory>"
            )
        out.append(_plain(conv, s, f"{conv.system}\n\n{tail}"))
    return out


# ----------------------------------------------------------------------------- edit
def clear_results(conv: ToolConversation, mode: str) -> list[Request] | None:
    if (window := _window(conv)) is None:
        return None
    cleared: set[int] = set()
    out = []
    for s in range(len(conv.points)):  # from the first request, so turn 0 has its clears
        body = conv.body[: conv.points[s]]
        results = [i for i, m in enumerate(body) if m["role"] == "tool"]
        if mode == "rolling":
            cleared |= set(results[:-2])
        elif len([i for i in results if i not in cleared]) > 3:
            cleared |= set(results[:-1])
        if s in window:
            msgs = [m | {"content": PLACEHOLDER} if i in cleared else m for i, m in enumerate(body)]
            out.append(
                Request((_system(conv.system), *msgs), conv.tools, conv.body[conv.points[s]])
            )
    return out


# ----------------------------------------------------------------------------- compact
def summary(body: Sequence[Message]) -> Message:
    lines = [SUMMARY_HEAD]
    for m in body:
        if m["role"] == "user":
            lines.append(f"The user asked: {m['content']}")
    lines += [f"- I called {_call_line(c, r)}" for c, r in _calls(body)]
    return {"role": "user", "content": "\n".join(lines)}


def _cut(body: Sequence[Message], end: int, keep: int = 4) -> int:
    """Where a compaction that keeps about `keep` messages before `end` cuts: never between a
    call and its result."""
    c = max(end - keep, 0)
    while c > 0 and body[c]["role"] == "tool":
        c -= 1
    return c


def compact(conv: ToolConversation, mode: str) -> list[Request] | None:
    if (window := _window(conv)) is None:
        return None
    out = []
    fixed_cut = _cut(conv.body, conv.points[window[3]])
    for t, s in enumerate(window):
        p = conv.points[s]
        c = _cut(conv.body, p) if mode == "rolling" else fixed_cut if t >= 3 else 0
        msgs = (summary(conv.body[:c]), *conv.body[c:p]) if c > 1 else conv.body[:p]
        out.append(Request((_system(conv.system), *msgs), conv.tools, conv.body[p]))
    return out


# ----------------------------------------------------------------------------- retry
def retry(conv: ToolConversation, mode: str) -> list[Request] | None:
    if (window := _window(conv, WINDOW - 1)) is None:
        return None
    edited = None
    if mode == "edit":  # the request that ends with an under-specified user message
        edited = next((s for s in window if conv.points[s] - 1 in conv.variants), None)
        if edited is None or edited == window[0]:
            return None
    # the turns re-sent unchanged: two, or one beside the edited turn
    resend = (
        {window[1], window[3]}
        if edited is None
        else {window[1] if edited > window[2] else window[3]}
    )
    out = []
    for s in window:
        req = _plain(conv, s)
        if s == edited:
            p = conv.points[s]
            first = conv.body[p - 1] | {"content": conv.variants[p - 1]}
            out.append(Request((*req.messages[:-1], first), conv.tools, None))
        elif s in resend:
            out.append(Request(req.messages, conv.tools, None))
        out.append(req)
    return out


# ----------------------------------------------------------------------------- fork
def _delegated(conv: ToolConversation) -> tuple[int, list[int]] | None:
    """The last user message (not the first) followed by two calls or more: its body index
    and the requests (points) of its calls."""
    users = [i for i, m in enumerate(conv.body) if m["role"] == "user"]
    for u, nxt in reversed(list(zip(users, [*users[1:], len(conv.body)], strict=True))):
        calls = [s for s, p in enumerate(conv.points) if u < p < nxt]
        if u != users[0] and len(calls) >= 2 and calls[0] >= len(conv.points) - WINDOW:
            return u, calls
    return None


def fork(conv: ToolConversation, mode: str) -> list[Request] | None:
    found = _delegated(conv)
    if found is None:
        return None
    u, calls = found
    body, tools, sys = conv.body, (*conv.tools, SUBAGENT_TOOL), _system(conv.system)
    end = conv.points[calls[-1]] + 2  # after the last delegated call's result
    task = body[u]["content"]
    report = "Report: " + "; ".join(_call_line(c, r) for c, r in _calls(body[u + 1 : end]))
    call = {
        "id": "call_subagent",
        "type": "function",
        "function": {"name": "run_subagent", "arguments": json.dumps({"task": task})},
    }
    delegation = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_subagent", "content": report}
    if mode == "fork":
        context = body[:u]
    else:
        pairs = [(c, r) for c, r in _calls(body[:u]) if r is not None][-2:]
        if not pairs:
            return None
        context = tuple(m for pair in pairs for m in pair)
    ask = {
        "role": "user",
        "content": "You are a subagent of the main agent. Carry out this "
        f"request, then report the calls you made and their results:\n{task}",
    }
    sub = [
        Request(
            (sys, *context, ask, *body[u + 1 : conv.points[s]]),
            tools,
            body[conv.points[s]],
            "subagent",
        )
        for s in calls
    ]
    last = {"role": "assistant", "content": report}
    sub.append(Request((sys, *context, ask, *body[u + 1 : end]), tools, last, "subagent"))
    out = [
        Request((sys, *body[: conv.points[s]]), tools, body[conv.points[s]])
        for s in range(max(len(conv.points) - WINDOW, 0), calls[0])
    ]
    out.append(Request((sys, *body[: u + 1]), tools, delegation))
    out += sub
    parent = (*body[: u + 1], delegation, result, *body[end:])
    out.append(Request((sys, *parent[: u + 3]), tools, None))  # the parent reads the report
    after = range(calls[-1] + 1, len(conv.points))
    shift = end - (u + 3)  # the delegated calls and results, less the delegation and its result
    out += [
        Request((sys, *parent[: conv.points[s] - shift]), tools, parent[conv.points[s] - shift])
        for s in after
    ]
    return out


FAMILIES: dict[str, Family] = {
    "chat-sysprompt": Family(("system",), ("memory", "clock"), sysprompt),
    "chat-edit": Family(("clear",), ("rolling", "batch"), clear_results),
    "chat-compact": Family(("compact",), ("once", "rolling"), compact),
    "chat-retry": Family(("retry",), ("resend", "edit"), retry),
    "chat-fork": Family(("fork",), ("fork", "delegate"), fork),
}
