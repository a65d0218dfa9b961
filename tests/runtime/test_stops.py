"""Stop strings: `cut_at_stop`, and `StopMatcher` against the whole-text check at every token."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence

import pytest

from agentcache.model.tokenizer import ByteTokenizer
from agentcache.runtime.stops import StopMatcher, cut_at_stop

MULTIBYTE = "Zürich 東京 naïve café 🦊🐈 — ½ ∑ x² Ωmega “quoted” ok. ünïcödé 한국어 😀!"


def test_cut_at_stop_cuts_at_the_earliest_stop_string() -> None:
    assert cut_at_stop("one two three", ("three", "two")) == "one "
    assert cut_at_stop("one two three", ("four",)) == "one two three"
    assert cut_at_stop("one two", ()) == "one two"
    assert cut_at_stop("東京🦊x", ("🦊",)) == "東京"


def test_stop_matcher_rejects_empty_stop_strings() -> None:
    decode = ByteTokenizer().decode
    for bad in ((), ("",), ("ok", "")):
        with pytest.raises(ValueError, match="non-empty"):
            StopMatcher(decode, bad)


def agrees_with_whole_text(
    decode: Callable[[Sequence[int]], str], ids: Sequence[int], stop: tuple[str, ...]
) -> StopMatcher:
    """Feed `ids` one by one; at every step up to the first stop string (where decoding stops)
    the matcher says what the whole text says."""
    matcher = StopMatcher(decode, stop)
    for n in range(1, len(ids) + 1):
        whole = decode(ids[:n])
        hit = any(s in whole for s in stop)
        assert matcher.feed(ids[n - 1]) == hit, (n, whole, stop)
        if hit:
            break
    return matcher


def random_stops(rng: random.Random, text: str) -> tuple[str, ...]:
    """Stop strings cut from `text` (so they occur, often across tokens), and one that may not."""
    stops = []
    for _ in range(rng.randint(1, 3)):
        start = rng.randrange(len(text))
        stops.append(text[start : start + rng.randint(1, 6)])
    stops.append(rng.choice(["zz", "🦊🦊", "ö", "\ufffd", "京 n"]))
    return tuple(stops)


def test_stop_matcher_agrees_with_the_whole_text_on_split_utf8_bytes() -> None:
    """Byte tokens split multibyte characters: pieces end in U+FFFD until they complete."""
    tok, rng = ByteTokenizer(), random.Random(0)
    for _ in range(200):
        ids = tok.encode(MULTIBYTE)
        start = rng.randrange(len(ids))
        ids = ids[start : start + rng.randint(1, 40)]
        if rng.random() < 0.3:  # stray bytes: invalid sequences
            ids.insert(rng.randrange(len(ids) + 1), rng.choice([0x80, 0xE6, 0xF0, 0xFF]))
        stops = random_stops(rng, tok.decode(ids))
        assert agrees_with_whole_text(tok.decode, ids, stops).full_decodes == 0


def test_a_step_that_changes_earlier_text_is_checked_on_the_whole_text() -> None:
    """A decoder that joins "a ." into "a.": the step's text does not extend its context's."""
    tok = ByteTokenizer()

    def decode(ids: Sequence[int]) -> str:
        return tok.decode(ids).replace(" .", ".")

    ids = tok.encode("to be .x")
    for stops in (("be.",), ("be .",), ("e.x",)):
        matcher = agrees_with_whole_text(decode, ids, stops)
        assert matcher.full_decodes == 1


def test_the_check_reads_a_bounded_window() -> None:
    """Per token the matcher decodes the context and the pending ids, not the whole output."""
    tok = ByteTokenizer()
    lengths: list[int] = []

    def decode(ids: Sequence[int]) -> str:
        lengths.append(len(ids))
        return tok.decode(ids)

    matcher = StopMatcher(decode, ("never",))
    for token in tok.encode("abc " * 500):
        assert not matcher.feed(token)
    assert max(lengths) <= 2


@pytest.mark.slow
def test_stop_matcher_agrees_with_the_whole_text_on_the_default_tokenizer() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from agentcache.model.loading import model_folder
    from agentcache.model.tokenizer import HFTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(model_folder(None)), "default")
    rng = random.Random(0)
    text_ids = tok.encode(MULTIBYTE * 2)
    vocab = len(tok.vocab)
    assert any(tok.decode([i]).endswith("\ufffd") for i in text_ids)  # characters split
    full_decodes = 0
    for _ in range(150):
        start = rng.randrange(len(text_ids))
        ids = text_ids[start : start + rng.randint(1, 30)]
        for _ in range(rng.randint(0, 3)):  # any token at all, specials included
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(vocab))
        stops = random_stops(rng, tok.decode(ids))
        full_decodes += agrees_with_whole_text(tok.decode, ids, stops).full_decodes
    assert full_decodes == 0
