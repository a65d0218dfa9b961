"""A turn's prompt as ordered segments: static system prefix, per-turn updates, reusable fixed.

[ system ........ ][ update (length varies) ][ fixed: history, memory ][ update ]
  reused as prefix   recomputed every turn    reused, shifted position   incl. last token
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentcache.errors import PromptError

ROLES = ("system", "user", "assistant", "tool")


def check_unicode(text: str, what: str) -> None:
    """Tokenizers and content hashes need text that encodes: a lone surrogate (e.g. from a
    JSON "\\ud800" escape) is a PromptError naming `what`, the character and its place."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(
            f"{what} is not valid Unicode: {text[e.start]!r} at character {e.start} ({e.reason})"
        ) from None


class SegmentKind(StrEnum):
    SYSTEM = "system"
    UPDATE = "update"
    FIXED = "fixed"

    @classmethod
    def parse(cls, value: str) -> SegmentKind:
        try:
            return cls(value)
        except ValueError:
            raise PromptError(
                f"unknown segment kind {value!r}; expected one of: system, update, fixed"
            ) from None


@dataclass(frozen=True)
class Segment:
    """One run of prompt text. `role` wraps it as a chat message; `id` names it across turns.
    `scope`, when set, keeps its cached KV private: only prompts whose segment has the same
    scope reuse it (e.g. one conversation's history); None shares it by content."""

    kind: SegmentKind
    text: str
    id: str | None = None
    role: str | None = None
    scope: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, SegmentKind):
            object.__setattr__(self, "kind", SegmentKind.parse(str(self.kind)))
        if self.role is not None and self.role not in ROLES:
            raise PromptError(f"unknown role {self.role!r}; expected one of: {', '.join(ROLES)}")
        if not isinstance(self.text, str):
            raise PromptError(f"segment text must be a string, got {type(self.text).__name__}")
        check_unicode(self.text, "segment text")
        for name in ("id", "scope"):  # cache keys and reports: a name, or none
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise PromptError(
                    f"segment {name} must be a string or None, got {type(value).__name__} "
                    f"{value!r:.60}"
                )
            if value is not None:
                check_unicode(value, f"segment {name}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        if "kind" not in d or "text" not in d:
            raise PromptError(f"a segment needs 'kind' and 'text', got keys {sorted(d)}")
        return cls(SegmentKind.parse(str(d["kind"])), d["text"], d.get("id"), d.get("role"))


@dataclass(frozen=True)
class SegmentedPrompt:
    """Ordered segments of one turn. A trailing assistant segment is continued, not closed."""

    segments: tuple[Segment, ...]

    def __init__(self, segments: Iterable[Segment]) -> None:
        if isinstance(segments, str) or not isinstance(segments, Iterable):
            raise PromptError(
                f"a prompt is a sequence of Segments, got {type(segments).__name__}; "
                "wrap text in Segment(kind, text, ...)"
            )
        segs = tuple(segments)
        for i, seg in enumerate(segs):
            if not isinstance(seg, Segment):
                raise PromptError(
                    f"prompt item {i} is a {type(seg).__name__}, not a Segment "
                    "(Segment.from_dict builds one from a dict)"
                )
        if not segs or not any(s.text for s in segs):
            raise PromptError("empty prompt: no segment has any text")
        object.__setattr__(self, "segments", segs)

    @classmethod
    def from_dicts(cls, items: Iterable[Mapping[str, Any]]) -> SegmentedPrompt:
        return cls(Segment.from_dict(d) for d in items)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)
