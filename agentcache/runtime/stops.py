"""Stop strings: where a reply's text ends, and the check at each decoded token whether it has.

`cut_at_stop` is the reference: the text before the first stop string. `StopMatcher` answers,
token by token, whether the text decoded so far holds a stop string, at a cost per token set by
the newest token's text and the longest stop string, not by the length of the output.

Ids are decoded as incremental detokenizers (vLLM's, TGI's) decode them: the ids not settled
yet are decoded after the previous piece's ids (their context: SentencePiece and similar
tokenizers decode a token's leading space by its neighbour), and the text past the context's
own is the new piece:

    ids       [ ... settled ... | context | pending ]
    text                        decode(context + pending) = decode(context) + new
    checked                     last (longest stop - 1) settled chars + new

A piece ending in U+FFFD (an incomplete UTF-8 character so far) stays pending, its ids decoded
again with the next token's; other pieces settle, and their ids become the next context. Where
decode(context + pending) does not begin with decode(context), that step checks the text of
every id instead (counted in `StopMatcher.full_decodes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

INCOMPLETE = "\ufffd"  # what a decoder shows for the bytes of a character not complete yet


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text before the first stop string in it; `text` itself when none occurs."""
    cut = min((i for s in stop if (i := text.find(s)) >= 0), default=-1)
    return text if cut < 0 else text[:cut]


class IncrementalText:
    """The ids of a reply and the text each new id adds, decoded as the module doc says."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self._context = 0  # index of the context's first id in ids
        self._pending = 0  # index of the first id not settled

    def add(self, token: int) -> None:
        self.ids.append(token)

    def new_text(self) -> str | None:
        """The text of the pending ids, decoded after the context's; None where that decode
        does not begin with the context's own text (the caller decodes every id instead)."""
        context = self.decode(self.ids[self._context : self._pending])
        text = self.decode(self.ids[self._context :])
        return text[len(context) :] if text.startswith(context) else None

    def settle(self) -> None:
        """The pending ids are settled: they become the next context."""
        self._context, self._pending = self._pending, len(self.ids)


class StopMatcher:
    """Whether the text of the ids fed so far holds one of `stop`; `decode` maps ids to text."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: tuple[str, ...]) -> None:
        if not stop or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop strings must be one or more non-empty strings, got {stop!r}")
        self._text = IncrementalText(decode)
        self.stop = stop
        self._reach = max(len(s) for s in stop) - 1  # settled chars a match may start in
        self._tail = ""  # the last `_reach` settled characters
        self.full_decodes = 0

    def feed(self, token: int) -> bool:
        """Add `token`; whether the text of the ids fed so far holds a stop string. Decoding
        stops at the first True: after it, answers may miss that first match."""
        self._text.add(token)
        new = self._text.new_text()
        if new is None:
            return self._feed_whole()
        hit = any(s in self._tail + new for s in self.stop)
        if not new.endswith(INCOMPLETE):
            self._tail = _last(self._tail + new, self._reach)
            self._text.settle()
        return hit

    def _feed_whole(self) -> bool:
        """The reference check, for a step whose new ids changed the context's text."""
        self.full_decodes += 1
        text = self._text.decode(self._text.ids)
        if not text.endswith(INCOMPLETE):
            self._tail = _last(text, self._reach)
            self._text.settle()
        return any(s in text for s in self.stop)


def _last(text: str, n: int) -> str:
    return text[max(0, len(text) - n) :]
