"""Provider cache controls: Anthropic `cache_control` breakpoints and the retention a request
asks for (Anthropic `ttl`, OpenAI `prompt_cache_retention` / `prompt_cache_options.ttl`).

Breakpoints. Every message is already a segment of its own, keyed by its content within the
tenant (chat/segmenter.py), so a breakpoint on a message's block, on a system block or on a tool
falls on (or inside) a segment the store keeps anyway: it is checked as the API checks it (at
most four, `type: "ephemeral"`, a known `ttl`, no longer ttl after a shorter one, never on an
empty text block) and counted in the report, and a breakpoint inside a message is rounded to
the end of that message's segment.

Retention. A ttl is a request that what is stored stays that long. It is granted up to the
server's cap (`--max-retention`) and reported as requested and granted; the store does not
yet pin entries for a ttl (eviction is by space, policy/), so `enforced` is reported false.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentcache.server.errors import APIError

MAX_BREAKPOINTS = 4
ANTHROPIC_TTLS = {"5m": 300, "1h": 3600}  # the API's two values
OPENAI_RETENTION = {"in_memory": 300, "in-memory": 300, "24h": 86400}  # prompt_cache_retention
DEFAULT_TTL_S = 300  # Anthropic's default ttl, and OpenAI's in-memory retention


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_value", param)


@dataclass(frozen=True)
class Retention:
    """What a request asked to keep and for how long, and what the server grants."""

    breakpoints: int
    requested_s: int | None  # None: no retention asked for
    granted_s: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"breakpoints": self.breakpoints, "requested_ttl_s": self.requested_s,
                "granted_ttl_s": self.granted_s, "enforced": False}  # fmt: skip


def retention(breakpoints: int, requested_s: int | None, cap_s: int) -> Retention:
    granted = None if requested_s is None else min(requested_s, cap_s)
    return Retention(breakpoints, requested_s, granted)


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
    ({"ttl": seconds or "5m"/"1h"/"24h"}) as one requested ttl in seconds (the longer)."""
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
        unknown = sorted(set(options) - {"ttl"})
        if unknown:
            raise bad(f"prompt_cache_options.{unknown[0]}", "unknown field (it takes ttl)")
        if "ttl" in options:
            asked.append(_ttl_value(options["ttl"], "prompt_cache_options.ttl"))
    return max(asked, default=None)


def _ttl_value(ttl: Any, param: str) -> int:
    named = {**ANTHROPIC_TTLS, "24h": 86400}
    if isinstance(ttl, str) and ttl in named:
        return named[ttl]
    if isinstance(ttl, int) and not isinstance(ttl, bool) and 1 <= ttl <= 86400:
        return ttl
    raise bad(param, f"must be '5m', '1h', '24h' or whole seconds in [1, 86400], got "
              f"{str(ttl)[:80]!r}")  # fmt: skip
