"""TextStream's windowed path against the reference: `safe_prefix` of the whole text decoded
again at every token, over random token streams that split multibyte characters."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from agentcache.chat.stream import TextStream, safe_prefix

Decode = Callable[[Sequence[int]], str]
STOPS = ("END", "\n\n", "😀!", "a é")  # "a \ufffd" shows "a": a stop may start in shown text
HOLDS = ("<tool_call>",)
WORDS = ["a", "bc", " ", "  ", "\n", "é", "中文", "😀", "!", "<", "<tool", "_call>", "EN", "D", "ü"]


def reference_pieces(
    decode: Decode, ids: Sequence[int], markers: tuple[str, ...], prefix: str
) -> list[str]:
    """What the stream shows at start and at each token: the whole text decoded again."""
    pieces, emitted = [], ""
    for n in range(len(ids) + 1):
        safe = safe_prefix(prefix + (decode(ids[:n]) if n else ""), markers)
        piece = safe[len(emitted) :] if safe.startswith(emitted) else ""
        emitted += piece
        pieces.append(piece)
    return pieces


def stream_pieces(
    decode: Decode, ids: Sequence[int], stops: tuple[str, ...], holds: tuple[str, ...], prefix: str
) -> tuple[list[str], TextStream]:
    stream = TextStream(decode, stops, holds, prefix)
    return [stream.start(), *(stream.push(i) for i in ids)], stream


def byte_stream(rng: random.Random, words: int) -> tuple[Decode, list[int]]:
    """A byte-level tokenizer made up for one text: its UTF-8 bytes (now and then an invalid
    byte) cut into tokens of 1-4 bytes, so tokens end inside multibyte characters."""
    data = "".join(rng.choice(WORDS) for _ in range(words)).encode()
    if rng.random() < 0.3:
        at = rng.randrange(len(data) + 1)
        data = data[:at] + b"\xff" + data[at:]
    vocab: list[bytes] = []
    while data:
        n = rng.randint(1, 4)
        vocab.append(data[:n])
        data = data[n:]

    def decode(ids: Sequence[int]) -> str:
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")

    return decode, list(range(len(vocab)))


def markers_for(rng: random.Random) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    stops = tuple(s for s in STOPS if rng.random() < 0.5)
    holds = HOLDS if rng.random() < 0.5 else ()
    return stops, holds, rng.choice(["", "Sure", "x <"])


@pytest.mark.parametrize("seed", range(300))
def test_the_window_shows_what_the_whole_text_shows(seed: int) -> None:
    rng = random.Random(seed)
    decode, ids = byte_stream(rng, rng.randint(1, 40))
    stops, holds, prefix = markers_for(rng)
    pieces, stream = stream_pieces(decode, ids, stops, holds, prefix)
    assert pieces == reference_pieces(decode, ids, (*stops, *holds), prefix)
    for n in range(len(ids) + 1):  # what was shown is the start of the text at every step
        assert (prefix + decode(ids[:n])).startswith("".join(pieces[: n + 1]))
    assert stream.full_decodes == 0  # a byte-level decode never changes settled text


def test_a_long_stream_decodes_each_id_a_bounded_number_of_times() -> None:
    decode, ids = byte_stream(random.Random(7), 3000)
    decoded = [0]

    def counting(part: Sequence[int]) -> str:
        decoded[0] += len(part)
        return decode(part)

    stops = ("\x00END",)  # never found: the stream runs to the end
    pieces, _ = stream_pieces(counting, ids, stops, (), "")
    assert pieces == reference_pieces(decode, ids, stops, "")
    assert decoded[0] < 10 * len(ids)  # decoding every id again each token: ~len(ids)**2 / 2


def test_a_stop_string_starting_in_shown_text_ends_the_stream() -> None:
    tokens = [b"xa", b" \xc3", b"\xa9b"]  # "xa" " " + half of "é", its other half + "b"

    def decode(ids: Sequence[int]) -> str:
        return b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")

    stream = TextStream(decode, ("a é",), ())
    assert [stream.push(i) for i in range(3)] == ["x", "a", ""]  # "a" then "a é"


def test_a_shown_pending_text_that_changes_takes_the_reference_path() -> None:
    tokens = [b"ab\xc3", b"\xa9"]  # "ab" + half of "é", then its other half

    def decode(ids: Sequence[int]) -> str:  # a decode that rewrites "bé" as "Bé"
        text = b"".join(tokens[i] for i in ids).decode("utf-8", errors="replace")
        return text.replace("bé", "Bé")

    pieces, stream = stream_pieces(decode, [0, 1], (), (), "")
    assert pieces == reference_pieces(decode, [0, 1], (), "") == ["", "ab", ""]
    assert stream.full_decodes == 1


def test_nothing_is_decoded_after_a_stop_string() -> None:
    words = ["ab", "END", "cd"]
    calls = []

    def decode(ids: Sequence[int]) -> str:
        calls.append(len(ids))
        return "".join(words[i] for i in ids)

    stream = TextStream(decode, ("END",), ())
    assert [stream.push(i) for i in (0, 1, 2, 2, 2)] == ["ab", "", "", "", ""]
    assert len(calls) == 4  # two decodes for each of the first two tokens


@pytest.mark.parametrize("seed", range(100))
def test_a_decode_that_rewrites_its_context_takes_the_reference_path(seed: int) -> None:
    rng = random.Random(seed)
    decode, ids = byte_stream(rng, rng.randint(1, 40))

    def cleaned(part: Sequence[int]) -> str:  # as tokenizers cleaning up spaces before "!"
        return decode(part).replace(" !", "!")

    stops, holds, prefix = markers_for(rng)
    pieces, _ = stream_pieces(cleaned, ids, stops, holds, prefix)
    assert pieces == reference_pieces(cleaned, ids, (*stops, *holds), prefix)


def test_a_context_rewritten_by_the_next_id_is_counted() -> None:
    words = ["a", " ", "!", "b"]
    stream = TextStream(lambda ids: "".join(words[i] for i in ids).replace(" !", "!"), (), ())
    assert [stream.push(i) for i in range(4)] == ["a", "", "!", "b"]
    assert stream.full_decodes == 1  # " " then " !" -> "!": the settled space is gone


@pytest.mark.slow
def test_the_window_matches_the_reference_with_the_default_tokenizer() -> None:
    from transformers import AutoTokenizer

    from agentcache.model.loading import model_folder
    from agentcache.model.tokenizer import HFTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(model_folder(None)), "default")
    vocab = len(tok.vocab)
    for seed in range(100):
        rng = random.Random(seed)
        if seed % 2:  # random ids: byte tokens split characters anywhere
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        else:
            ids = tok.encode("".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))))
        stops, holds, prefix = markers_for(rng)
        pieces, stream = stream_pieces(tok.decode, ids, stops, holds, prefix)
        assert pieces == reference_pieces(tok.decode, ids, (*stops, *holds), prefix), seed
        assert stream.full_decodes == 0, seed  # the tokenizer's decode never rewrites context
