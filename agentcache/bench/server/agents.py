"""Agents replaying workload chat sessions against a server, N at a time.

A session is a chat workload line (workload/chat.py): each turn the OpenAI message list (and
tools) its client sends, the whole conversation so far. The replay sends those lists as they
are, whatever the server replied, so every target and every run receives the same requests;
a tool-use session's tool results are the ones the workload recorded (bfcl's simulators run on
the recorded calls). After each turn but the last the agent sleeps its pause (its tools
running), then sends the next turn.

    client 0: [s0 t0]..pause..[s0 t1]..pause..[s0 t2] [s2 t0]..pause..[s2 t1] ...
    client 1: [s1 t0]....pause....[s1 t1]..pause..[s1 t2] [s3 t0] ...

The sessions wait in one queue; each of `clients` threads takes the next when it finishes
one. A session's job completion time runs from its first request to its last reply, pauses
included.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentcache.bench.server.chat_client import TurnError, TurnResult, stream_turn

SPLITS = ("tune", "validate", "all")


@dataclass(frozen=True)
class ReplaySession:
    """A chat workload session: each turn's request (`messages`, `tools`) and reply budget."""

    name: str
    case: str
    requests: tuple[dict[str, Any], ...]
    max_tokens: tuple[int, ...]
    salt: str | None = None  # its requests' cache_salt: the tenant it replays as (None: none)


def load_sessions(
    path: Path, split: str = "validate", names: Sequence[str] = (), n: int | None = None,
    default_max_tokens: int = 32,
) -> list[ReplaySession]:  # fmt: skip
    """The chat sessions of a workload file: those of `split` (`all`: every one; a line without
    a split is a validation session), then those named in `names` (in that order; all when
    empty), then the first `n`. Raises ValueError for a named session not found or for no
    session left."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        turns = obj.get("turns") or []
        if not turns or not all(isinstance(t, dict) and "messages" in t for t in turns):
            continue  # a segment session: not what a chat client sends
        if split != "all" and obj.get("split", "validate") != split:
            continue
        found.append(ReplaySession(
            str(obj["name"]), str(obj.get("case", "")),
            tuple({"messages": t["messages"], "tools": t.get("tools", [])} for t in turns),
            tuple(int(t.get("max_new_tokens", default_max_tokens)) for t in turns),
        ))  # fmt: skip
    if names:
        by_name = {s.name: s for s in found}
        missing = [x for x in names if x not in by_name]
        if missing:
            raise ValueError(f"no chat session named {', '.join(missing)} in {path} ({split})")
        found = [by_name[x] for x in names]
    found = found[:n] if n is not None else found
    if not found:
        raise ValueError(f"no chat session in {path} for split {split!r}")
    return found


@dataclass(frozen=True)
class TurnRecord:
    """One request of a phase: which session, turn and client; when it was sent (seconds
    after the phase began); the result, or the error that ended its session."""

    session: str
    turn: int
    client: int
    sent_s: float
    result: TurnResult | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"session": self.session, "turn": self.turn, "client": self.client,
             "sent_s": round(self.sent_s, 4), "error": self.error}  # fmt: skip
        return d | (asdict(self.result) if self.result is not None else {})


@dataclass
class Phase:
    """A phase's requests, wall time, and each finished session's job completion time."""

    wall_s: float = 0.0
    turns: list[TurnRecord] = field(default_factory=list)
    jct_s: dict[str, float] = field(default_factory=dict)


def run_phase(
    url: str, model: str, sessions: Sequence[ReplaySession], clients: int,
    pauses: dict[str, list[float]], max_tokens: int | None = None,
    on_turn: Callable[[TurnRecord], None] = lambda _: None, timeout_s: float = 1800.0,
) -> Phase:  # fmt: skip
    """Replay `sessions` with `clients` agents at once (see the module docstring); `pauses`
    gives each session's pauses by name (a missing one: none). `max_tokens` overrides every
    turn's budget. `on_turn` is called from the agents' threads after each request."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    work: queue.SimpleQueue[ReplaySession] = queue.SimpleQueue()
    for s in sessions:
        work.put(s)
    phase, lock = Phase(), threading.Lock()
    t0 = time.perf_counter()

    def record(rec: TurnRecord) -> None:
        with lock:
            phase.turns.append(rec)
        on_turn(rec)

    def agent(client: int) -> None:
        with httpx.Client(base_url=url, timeout=timeout_s) as http:
            while True:
                try:
                    s = work.get_nowait()
                except queue.Empty:
                    return
                start = time.perf_counter()
                done = replay_session(http, model, s, pauses.get(s.name, []), client, t0,
                                      max_tokens, record)  # fmt: skip
                if done:
                    with lock:
                        phase.jct_s[s.name] = time.perf_counter() - start

    threads = [threading.Thread(target=agent, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phase.wall_s = time.perf_counter() - t0
    phase.turns.sort(key=lambda r: (r.session, r.turn))
    return phase


def replay_session(
    http: httpx.Client, model: str, session: ReplaySession, pauses: Sequence[float], client: int,
    t0: float, max_tokens: int | None, record: Callable[[TurnRecord], None],
) -> bool:  # fmt: skip
    """One session's turns, a pause before each but the first; False if a request failed
    (the session then ends there: its later turns are not sent)."""
    conversation = None
    for i, request in enumerate(session.requests):
        if i and i - 1 < len(pauses):
            time.sleep(pauses[i - 1])
        sent = time.perf_counter() - t0
        budget = session.max_tokens[i] if max_tokens is None else max_tokens
        try:
            result = stream_turn(http, model, request, budget, conversation, session.salt)
        except (TurnError, httpx.HTTPError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"[:300]
            record(TurnRecord(session.name, i, client, sent, None, error))
            return False
        conversation = result.conversation or conversation
        record(TurnRecord(session.name, i, client, sent, result))
    return True
