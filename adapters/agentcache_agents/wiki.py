"""An offline knowledge base for ReAct-style Search / Lookup actions (in the spirit of the
Wikipedia API the Reflexion and ReAct papers use, with no network)."""

from __future__ import annotations

import re
from collections.abc import Mapping


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class KnowledgeBase:
    """Titles -> passages. `search` opens a passage (or lists similar titles); `lookup` returns
    the next sentence of the open passage that contains a keyword."""

    def __init__(self, passages: Mapping[str, str]) -> None:
        self.passages = dict(passages)
        self._open: list[str] = []
        self._lookups: dict[str, int] = {}

    def search(self, entity: str) -> str:
        key = entity.strip().lower()
        for title, text in self.passages.items():
            if title.lower() == key:
                self._open = re.split(r"(?<=[.!?])\s+", text)
                self._lookups = {}
                return text
        ranked = sorted(self.passages, key=lambda t: -len(_words(t) & _words(entity)))
        similar = [t for t in ranked if _words(t) & _words(entity)][:5] or ranked[:5]
        return f"Could not find [{entity}]. Similar: {similar}."

    def lookup(self, keyword: str) -> str:
        if not self._open:
            return "No passage is open: Search first."
        hits = [s for s in self._open if keyword.strip().lower() in s.lower()]
        n = self._lookups.get(keyword, 0)
        self._lookups[keyword] = n + 1
        if n >= len(hits):
            return "No more results."
        return f"(Result {n + 1} / {len(hits)}) {hits[n]}"
