"""Incremental reply text for streaming: what may be shown so far, so that the pieces add up
to exactly the final content.

Held back: text from the first stop string or hold marker (e.g. `<tool_call>`) on; a tail that
could still become one; a trailing incomplete UTF-8 character (decoded as U+FFFD); trailing
whitespace (the final content of a tool-calling reply is right-stripped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        stops: Sequence[str],
        holds: Sequence[str],
        prefix: str = "",
    ) -> None:
        self._decode = decode
        self._markers = tuple(m for m in (*stops, *holds) if m)
        self._prefix = prefix
        self._ids: list[int] = []
        self.emitted = ""
        self.mismatches = 0  # final content that did not extend what was shown (counted)

    def start(self) -> str:
        return self._advance(self._prefix)

    def push(self, token: int) -> str:
        self._ids.append(token)
        return self._advance(self._prefix + self._decode(self._ids))

    def finish(self, content: str) -> str:
        if not content.startswith(self.emitted):
            self.mismatches += 1
            return ""
        rest = content[len(self.emitted) :]
        self.emitted = content
        return rest

    def _advance(self, text: str) -> str:
        safe = self._safe(text)
        if not safe.startswith(self.emitted):
            return ""
        piece = safe[len(self.emitted) :]
        self.emitted = safe
        return piece

    def _safe(self, text: str) -> str:
        cut = min((i for m in self._markers if (i := text.find(m)) >= 0), default=len(text))
        text = text[:cut]
        for m in self._markers:  # a tail that may grow into a marker
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    text = text[:-k]
                    break
        return text.rstrip("\ufffd").rstrip()
