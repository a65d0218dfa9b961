"""Seeded agent sessions of varied structure, in the segment format of memgpt.jsonl.

One session, turn t (sizes and counts drawn per session from its seed):

    [system][upd-0 .. upd-k][h-0][h-1] ... [upd-mid] ... [h-n][upd-tail][reply]
     static  before history   fixed history items, the newest  after     open assistant
             (rolling)        of this turn updates             (rolling) message, mid-sentence

- `upd-*` blocks are rolling updates: each has a change rate; a swing session redraws a
  changing block's size each turn (hundreds of tokens), a shift session edits a line or two,
  so every fixed segment after it shifts by that much;
- history items (user requests, assistant actions, tool outputs of a drawn length) arrive
  1-3 a turn after a drawn pre-filled history; an item is an update the turn it arrives and
  fixed, byte-identical, afterwards;
- an optional `upd-mid` block sits inside the history (retrieved context between items) and
  an optional `upd-tail` after it.

Texts come from a `TextPool` (the builder fills it from the shipped packages' data). Each
session records the parameters it was drawn with (`structure`), so a result can be read
against them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

MAX_NEW_TOKENS = 32
CASES = ("swing", "shift")
Segment = dict[str, str]


@dataclass(frozen=True)
class TextPool:
    """Source texts: each list non-empty; a draw takes consecutive items cyclically."""

    passages: tuple[str, ...]  # documents and tool outputs (essay passages)
    requests: tuple[str, ...]  # user requests (bfcl questions, chitchat messages)
    actions: tuple[str, ...]  # assistant actions and replies (bfcl calls, chitchat replies)
    tools: tuple[str, ...]  # tool descriptions for system prompts

    def __post_init__(self) -> None:
        for name, items in asdict(self).items():
            if not items:
                raise ValueError(f"TextPool.{name} must not be empty")


@dataclass(frozen=True)
class Structure:
    """What one session was drawn with (word counts; a word is about 1.3 tokens)."""

    case: str  # swing | shift
    system_tools: int  # tool descriptions in the system prompt
    head_blocks: int  # rolling update blocks before the history
    head_words: tuple[int, ...]  # each block's first size
    head_change: tuple[float, ...]  # each block's chance to change on a turn
    prefilled: int  # history items before the first turn
    new_items: tuple[int, ...]  # history items arriving on each turn
    tool_words: tuple[int, int]  # a tool output's size range
    mid_block: int | None  # history position of an upd-mid block (None: none)
    tail_block: bool


def draw_structure(rng: random.Random, case: str, turns: int) -> Structure:
    head = rng.randint(1, 3)
    low = rng.choice((20, 40, 80))
    return Structure(
        case=case,
        system_tools=rng.randint(2, 8),
        head_blocks=head,
        head_words=tuple(rng.randint(40, 300) for _ in range(head)),
        head_change=(1.0, *(rng.choice((0.0, 0.5, 1.0)) for _ in range(head - 1))),
        prefilled=rng.randint(3, 12),
        new_items=tuple(rng.randint(1, 3) for _ in range(turns)),
        tool_words=(low, low + rng.choice((40, 120, 200))),
        mid_block=rng.randint(1, 3) if rng.random() < 0.4 else None,
        tail_block=rng.random() < 0.5,
    )


class _Texts:
    """Cyclic cursors into the pool, one per kind, started at drawn offsets."""

    def __init__(self, pool: TextPool, rng: random.Random) -> None:
        self.pool = pool
        self.at = {k: rng.randrange(len(v)) for k, v in asdict(pool).items()}

    def take(self, kind: str) -> str:
        items: Sequence[str] = getattr(self.pool, kind)
        text = items[self.at[kind] % len(items)]
        self.at[kind] += 1
        return text

    def words(self, kind: str, n: int) -> str:
        """About n words of consecutive `kind` texts."""
        out: list[str] = []
        while len(out) < n:
            out += self.take(kind).split()
        return " ".join(out[:n])


def _history_item(texts: _Texts, rng: random.Random, s: Structure, k: int) -> tuple[str, str]:
    """The k-th history item, in cycles of request, action, tool output, action, tool output."""
    if k % 5 == 0:
        return "user", f"Request: {texts.take('requests')}"
    if k % 5 in (1, 3):
        return "assistant", f"Action: {texts.take('actions')}"
    return "tool", f"Observation: {texts.words('passages', rng.randint(*s.tool_words))}"


def _block(texts: _Texts, name: str, t: int, words: int) -> str:
    return f"[{name} as of step {t + 1}]\n{texts.words('passages', words)}"


def generate_session(
    seed: int, name: str, split: str, pool: TextPool, case: str, turns: int = 6
) -> dict[str, Any]:
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; expected one of {', '.join(CASES)}")
    if turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns}")
    rng = random.Random(seed)
    s = draw_structure(rng, case, turns)
    texts = _Texts(pool, rng)
    tools = "\n".join(f"- {texts.take('tools')}" for _ in range(s.system_tools))
    system = (
        "You are an agent that completes the user's requests step by step with the tools "
        f"below. Read the context blocks before acting.\nTools:\n{tools}"
    )
    head = [_block(texts, f"context {j}", 0, w) for j, w in enumerate(s.head_words)]
    sizes = list(s.head_words)
    items = [(*_history_item(texts, rng, s, k), -1) for k in range(s.prefilled)]
    out = []
    for t in range(turns):
        if t > 0:
            for j in range(s.head_blocks):
                if rng.random() < s.head_change[j]:
                    head[j], sizes[j] = _changed(texts, rng, s, j, t, head[j], sizes[j])
        n = len(items)
        items += [(*_history_item(texts, rng, s, n + k), t) for k in range(s.new_items[t])]
        segs = [_seg("system", "sys", "system", system)]
        segs += [_seg("update", f"upd-{j}", "user", h) for j, h in enumerate(head)]
        for k, (role, text, first) in enumerate(items):
            if k == s.mid_block:
                segs.append(_seg("update", "upd-mid", "user", _block(texts, "retrieved", t, 60)))
            segs.append(_seg("update" if first == t else "fixed", f"h-{k}", role, text))
        if s.tail_block:
            segs.append(
                _seg(
                    "update",
                    "upd-tail",
                    "user",
                    f"Scratchpad, step {t + 1}: " + texts.words("actions", rng.randint(10, 60)),
                )
            )
        segs.append(
            _seg(
                "update",
                "reply",
                "assistant",
                "Thought: From the last observation, the next step is to",
            )
        )
        out.append({"segments": segs, "max_new_tokens": MAX_NEW_TOKENS})
    return {
        "name": name,
        "workload": "generated",
        "case": case,
        "split": split,
        "seed": seed,
        "structure": asdict(s),
        "turns": out,
    }


def _changed(
    texts: _Texts, rng: random.Random, s: Structure, j: int, t: int, text: str, words: int
) -> tuple[str, int]:
    """A head block's next text: redrawn at a new size (swing) or one line appended (shift)."""
    if s.case == "swing":  # 180-400 words up or down, within 20-600: the side with room
        step = rng.randint(180, 400)
        up = rng.random() < 0.5 if 20 + step <= words <= 600 - step else words < 310
        words = min(600, words + step) if up else max(20, words - step)
        return _block(texts, f"context {j}", t, words), words
    line = texts.words("actions", rng.randint(3, 12))
    return f"{text}\n- step {t + 1}: {line}", words


def _seg(kind: str, sid: str, role: str, text: str) -> Segment:
    return {"kind": kind, "id": sid, "role": role, "text": text}


def rolling(sid: str) -> bool:
    """Ids whose text may change every turn."""
    return sid.startswith("upd-") or sid == "reply"


def check_generated(session: dict[str, Any], count: Callable[[str], int]) -> list[int]:
    """A history item keeps its text once shown and is fixed from the turn after it arrives;
    every turn has history and ends in an open assistant message. Returns prompt sizes."""
    seen: dict[str, str] = {}
    arrived: set[str] = set()
    sizes = []
    for t, turn in enumerate(session["turns"]):
        segs = turn["segments"]
        where = f"{session['name']} turn {t}"
        if segs[0]["kind"] != "system" or segs[-1]["id"] != "reply":
            raise ValueError(f"{where}: must start with the system prompt and end in the reply")
        kinds = {s["id"]: s["kind"] for s in segs}
        if not arrived <= {sid for sid, k in kinds.items() if k == "fixed"}:
            raise ValueError(f"{where}: an item from an earlier turn is not fixed")
        if "fixed" not in kinds.values() and t > 0:
            raise ValueError(f"{where}: no fixed history")
        for seg in segs:
            if not rolling(seg["id"]) and seen.setdefault(seg["id"], seg["text"]) != seg["text"]:
                raise ValueError(f"{where}: {seg['id']} changed")
        arrived = {s["id"] for s in segs if s["id"].startswith("h-")}
        sizes.append(sum(count(s["text"]) + 5 for s in segs))
    return sizes
