"""Incremental reply text for streaming: what may be shown so far, so that the pieces add up
to exactly the final content.

Held back: text from the first stop string or hold marker (e.g. `<tool_call>`) on; a tail that
could still become one; a trailing incomplete UTF-8 character (decoded as U+FFFD); trailing
whitespace (the final content of a tool-calling reply is right-stripped).

`safe_prefix` is the reference: what of a whole text may be shown. `TextStream` decodes the
ids with `runtime.stops.IncrementalText`, as `StopMatcher` does (the ids not settled yet after
the previous piece's ids, a piece ending in U+FFFD staying pending) and applies `safe_prefix`
to a window: the last (longest marker - 1) characters shown and the text after them:

    text      [ ... shown ... | shown tail | held (settled) | pending ids' text ]
    window                    [-------------------------------------------------]

A marker or a tail held back starts inside the window, and text stripped back past the shown
tail leaves nothing to show either way, so the window's safe prefix ends where the whole
text's does. A token's cost is set by the window (the newest piece, the longest marker, the
text held back), not by the length of the output. After a marker nothing more is shown. Where
the context's text changes with the new ids, or what was shown is not a prefix of the text,
the step takes the reference path over every id (counted in `full_decodes`) until the shown
text is again a prefix of a settled text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentcache.runtime.stops import INCOMPLETE, IncrementalText


def safe_prefix(text: str, markers: Sequence[str]) -> str:
    """The reference: the part of the whole `text` that may be shown (module doc)."""
    return _hold_back(text, markers)[0]


def _hold_back(text: str, markers: Sequence[str]) -> tuple[str, bool]:
    """`safe_prefix(text, markers)`, and whether a marker occurs in `text`."""
    cut = min((i for m in markers if (i := text.find(m)) >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    for m in markers:  # a tail that may grow into a marker
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                text = text[:-k]
                break
    return text.rstrip(INCOMPLETE).rstrip(), cut >= 0


class TextStream:
    """The pieces of a reply's text that may be shown, token by token; `decode` maps ids to
    text, `prefix` is text before the first id (a prefilled reply)."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        stops: Sequence[str],
        holds: Sequence[str],
        prefix: str = "",
    ) -> None:
        self._text = IncrementalText(decode)
        self._markers = tuple(m for m in (*stops, *holds) if m)
        self._reach = max((len(m) for m in self._markers), default=1) - 1
        self._prefix = prefix
        self._shown: list[str] = []
        self._shown_tail = ""  # the last `_reach` characters shown
        self._held = prefix  # settled text after the shown text ("" while `_ahead` > 0)
        self._new = ""  # the pending ids' text
        self._ahead = 0  # characters of `_new` already shown
        self._marked = False  # a marker was found: nothing more is shown
        self._synced = True  # the shown text is a prefix of the text, which the state holds
        self.mismatches = 0  # final content that did not extend what was shown (counted)
        self.full_decodes = 0  # steps that decoded every id (module doc)

    @property
    def emitted(self) -> str:
        """Everything shown so far."""
        return "".join(self._shown)

    def start(self) -> str:
        return self._advance()

    def push(self, token: int) -> str:
        self._text.add(token)
        if self._marked:
            return ""
        if not self._synced:
            return self._push_whole()
        new = self._text.new_text()
        if new is None:
            return self._push_whole()
        if not new.startswith(self._new[: self._ahead]):  # shown pending text changed
            return self._push_whole()
        if new.endswith(INCOMPLETE):
            self._new = new
        else:
            self._held += new[self._ahead :]
            self._new, self._ahead = "", 0
            self._text.settle()
        return self._advance()

    def finish(self, content: str) -> str:
        emitted = self.emitted
        if not content.startswith(emitted):
            self.mismatches += 1
            return ""
        self._shown = [content]
        return content[len(emitted) :]

    def _advance(self) -> str:
        """The next piece, from the window (module doc)."""
        base = len(self._shown_tail)
        window = self._shown_tail + self._held + self._new[self._ahead :]
        safe, self._marked = _hold_back(window, self._markers)
        if len(safe) <= base:
            return ""
        piece = safe[base:]
        self._show(piece)
        if len(piece) <= len(self._held):
            self._held = self._held[len(piece) :]
        else:
            self._ahead += len(piece) - len(self._held)
            self._held = ""
        return piece

    def _push_whole(self) -> str:
        """The reference step over every id; the window state again where it can hold."""
        self.full_decodes += 1
        text = self._prefix + self._text.decode(self._text.ids)
        emitted = self.emitted
        safe, marked = _hold_back(text, self._markers)
        piece = safe[len(emitted) :] if safe.startswith(emitted) else ""
        self._show(piece)
        shown = len(emitted) + len(piece)
        self._synced = text.startswith(emitted) and not text.endswith(INCOMPLETE)
        if self._synced:
            self._marked = marked
            self._held, self._new, self._ahead = text[shown:], "", 0
            self._text.settle()
        return piece

    def _show(self, piece: str) -> None:
        if piece:
            self._shown.append(piece)
            tail = self._shown_tail + piece
            self._shown_tail = tail[max(0, len(tail) - self._reach) :]
