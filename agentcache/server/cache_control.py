"""Provider cache controls: Anthropic `cache_control` and OpenAI `prompt_cache_breakpoint`
breakpoints, and the retention a request asks for (Anthropic `ttl`, OpenAI
`prompt_cache_retention`, `prompt_cache_options.ttl`, a breakpoint's `ttl`).

Breakpoints. Every message is already a segment of its own, keyed by its content within the
tenant (chat/segmenter.py), so a breakpoint on a message's block, on a system block or on a tool
falls on (or inside) a segment the store keeps anyway: it is checked as the API checks it
(Anthropic: at most four, `type: "ephemeral"`, a known `ttl`, no longer ttl after a shorter one,
never on an empty text block; OpenAI: `{"mode": "explicit"}` with an optional `ttl` of `30m` or
`12h`, on an input text part) and counted in the report, and a breakpoint inside a message is
rounded to the end of that message's segment.

Retention. A ttl is a request that what is stored stays that long. It is granted up to the
server's cap (`--max-retention`) and reported as requested and granted; the chat engine then
pins the turn's segments in the store for the granted time (chat/retention.py), and the report
says what was pinned (`Retention.to_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentcache.chat.retention import RetentionReport
from agentcache.server.errors import APIError

MAX_BREAKPOINTS = 4
ANTHROPIC_TTLS = {"5m": 300, "1h": 3600}  # the API's two values
OPENAI_RETENTION = {"in_memory": 300, "in-memory": 300, "24h": 86400}  # prompt_cache_retention
OPENAI_BREAKPOINT_TTLS = {"30m": 1800, "12h": 43200}  # prompt_cache_breakpoint.ttl
OPENAI_CACHE_MODES = ("implicit", "explicit")  # prompt_cache_options.mode
DEFAULT_TTL_S = 300  # Anthropic's default ttl, and OpenAI's in-memory retention


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_value", param)


@dataclass(frozen=True)
class Retention:
    """What a request asked to keep and for how long, and what the server grants."""

    breakpoints: int
    requested_s: int | None  # None: no retention asked for
    granted_s: int | None

    def to_dict(self, kept: RetentionReport | None = None) -> dict[str, Any]:
        """The request's side, and what the turn retained (`kept`, None: nothing known);
        `enforced`: the store pins the turn's segments for `retained_ttl_s`."""
        out = {"breakpoints": self.breakpoints, "requested_ttl_s": self.requested_s,
               "granted_ttl_s": self.granted_s, "enforced": False}  # fmt: skip
        if kept is not None:
            out.update(kept.to_dict())
        return out


def retention(breakpoints: int, requested_s: int | None, cap_s: int) -> Retention:
    granted = None if requested_s is None else min(requested_s, cap_s)
    return Retention(breakpoints, requested_s, granted)


def breakpoint_ttl(mark: Any, param: str) -> int | None:
    """An OpenAI `prompt_cache_breakpoint` ({"mode": "explicit"}, optionally a `ttl` of
    '30m' or '12h'): its ttl in seconds, None without one (the request's applies); APIError
    naming the field when malformed."""
    if not isinstance(mark, Mapping):
        raise bad(param, f"an object is required, got {type(mark).__name__}")
    unknown = sorted(set(mark) - {"mode", "ttl"})
    if unknown:
        raise bad(f"{param}.{unknown[0]}", "unknown field (it takes mode and ttl)")
    if mark.get("mode") != "explicit":
        raise bad(f"{param}.mode", f"must be 'explicit', got {str(mark.get('mode'))[:80]!r}")
    ttl = mark.get("ttl")
    if ttl is None:
        return None
    if not isinstance(ttl, str) or ttl not in OPENAI_BREAKPOINT_TTLS:
        raise bad(f"{param}.ttl", f"must be '30m' or '12h', got {str(ttl)[:80]!r}")
    return OPENAI_BREAKPOINT_TTLS[ttl]


def openai_breakpoints(messages: Any, param: str, parts: frozenset[str]) -> list[int | None]:
    """The `prompt_cache_breakpoint` marks on the content parts of `messages` (chat messages
    or Responses input items, as dicts), in prompt order: each one's ttl (None: the
    request's). Only parts of a type in `parts` may carry one; APIError naming the mark."""
    marks: list[int | None] = []
    for i, message in enumerate(messages or ()):
        if not isinstance(message, Mapping):
            continue  # the API's own parser names it
        for key in ("content", "output"):
            content = message.get(key)
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("prompt_cache_breakpoint") is None:
                    continue
                p = f"{param}.{i}.{key}.{j}.prompt_cache_breakpoint"
                if part.get("type") not in parts:
                    raise bad(p, "a breakpoint can be set on input text parts only, not on a "
                              f"{str(part.get('type'))[:40]!r} part")  # fmt: skip
                marks.append(breakpoint_ttl(part["prompt_cache_breakpoint"], p))
    return marks


def openai_cache_controls(
    messages: Any, param: str, parts: frozenset[str], retention_field: Any, options: Any,
    cap_s: int,
) -> Retention:  # fmt: skip
    """An OpenAI request's breakpoints and retention (the longest ttl any of them asks for),
    granted up to `cap_s`."""
    marks = openai_breakpoints(messages, param, parts)
    asked = [t for t in (openai_retention(retention_field, options), *marks) if t is not None]
    return retention(len(marks), max(asked, default=None), cap_s)


class Breakpoints:
    """The cache_control marks of one Messages request, in prompt order."""

    def __init__(self) -> None:
        self.ttls: list[tuple[str, int]] = []  # (param, ttl seconds)

    def read(self, holder: Mapping[str, Any], param: str, empty_text: bool = False) -> None:
        """The `cache_control` of `holder` (a block or a tool), if any. `empty_text`: the
        holder is a text block without text, which cannot carry one."""
        if "cache_control" not in holder or holder["cache_control"] is None:
            return
        p = f"{param}.cache_control"
        cc = holder["cache_control"]
        if empty_text:
            raise bad(p, "cache_control cannot be set on an empty text block")
        self.ttls.append((p, ttl_of(cc, p)))
        if len(self.ttls) > MAX_BREAKPOINTS:
            raise bad(p, f"a request may have at most {MAX_BREAKPOINTS} blocks with "
                      f"cache_control, found {len(self.ttls)}")  # fmt: skip

    def check_order(self) -> None:
        """A longer ttl may not follow a shorter one in prompt order (as the API requires)."""
        shortest = None
        for p, ttl in self.ttls:
            if shortest is not None and ttl > shortest:
                raise bad(p, "a cache_control with ttl '1h' must come before any with ttl '5m'")
            shortest = ttl if shortest is None else min(shortest, ttl)

    def longest(self) -> int | None:
        return max((t for _, t in self.ttls), default=None)


def ttl_of(cc: Any, param: str) -> int:
    """A cache_control object's ttl in seconds; APIError naming the field when malformed."""
    if not isinstance(cc, Mapping):
        raise bad(param, f"an object is required, got {type(cc).__name__}")
    if cc.get("type") != "ephemeral":
        raise bad(f"{param}.type", f"must be 'ephemeral', got {str(cc.get('type'))[:80]!r}")
    unknown = sorted(set(cc) - {"type", "ttl"})
    if unknown:
        raise bad(f"{param}.{unknown[0]}", "unknown field (cache_control takes type and ttl)")
    ttl = cc.get("ttl", "5m")
    if not isinstance(ttl, str) or ttl not in ANTHROPIC_TTLS:
        raise bad(f"{param}.ttl", f"must be '5m' or '1h', got {str(ttl)[:80]!r}")
    return ANTHROPIC_TTLS[ttl]


def openai_retention(retention_field: Any, options: Any) -> int | None:
    """OpenAI's `prompt_cache_retention` ('in_memory' or '24h') and `prompt_cache_options`
    ({"mode": "implicit" or "explicit", "ttl": seconds or "5m"/"30m"/"1h"/"12h"/"24h"}) as
    one requested ttl in seconds (the longer). `mode` changes nothing here: every segment is
    stored, marked or not."""
    asked: list[int] = []
    if retention_field is not None:
        if not isinstance(retention_field, str) or retention_field not in OPENAI_RETENTION:
            raise bad("prompt_cache_retention", "must be 'in_memory' or '24h', got "
                      f"{str(retention_field)[:80]!r}")  # fmt: skip
        asked.append(OPENAI_RETENTION[retention_field])
    if options is not None:
        if not isinstance(options, Mapping):
            raise bad(
                "prompt_cache_options", f"an object is required, got {type(options).__name__}"
            )
        unknown = sorted(set(options) - {"ttl", "mode"})
        if unknown:
            raise bad(f"prompt_cache_options.{unknown[0]}", "unknown field (it takes mode "
                      "and ttl)")  # fmt: skip
        mode = options.get("mode")
        if mode is not None and mode not in OPENAI_CACHE_MODES:
            raise bad("prompt_cache_options.mode", "must be 'implicit' or 'explicit', got "
                      f"{str(mode)[:80]!r}")  # fmt: skip
        if "ttl" in options:
            asked.append(_ttl_value(options["ttl"], "prompt_cache_options.ttl"))
    return max(asked, default=None)


def _ttl_value(ttl: Any, param: str) -> int:
    named = {**ANTHROPIC_TTLS, **OPENAI_BREAKPOINT_TTLS, "24h": 86400}
    if isinstance(ttl, str) and ttl in named:
        return named[ttl]
    if isinstance(ttl, int) and not isinstance(ttl, bool) and 1 <= ttl <= 86400:
        return ttl
    raise bad(param, f"must be '5m', '30m', '1h', '12h', '24h' or whole seconds in "
              f"[1, 86400], got {str(ttl)[:80]!r}")  # fmt: skip
