"""The decode loop over a scripted `Decoder`: what it emits, when it stops, what it feeds."""

from __future__ import annotations

import torch
from torch import Tensor

from agentcache.decode.base import Decoder
from agentcache.model.tokenizer import ByteTokenizer
from agentcache.runtime.loop import decode_loop
from agentcache.runtime.params import GenerationParams

TOK = ByteTokenizer()
VOCAB = 260


def one_hot(token: int) -> Tensor:
    logits = torch.zeros(VOCAB)
    logits[token] = 1.0
    return logits


class Scripted(Decoder):
    """Answers each feed from `script` (logits for a token id, a chosen id as an int, None)."""

    def __init__(self, script: list[Tensor | int | None]) -> None:
        self.script = script
        self.fed: list[tuple[int, int, int]] = []

    def feed(self, token: int, position: int, room: int) -> Tensor | int | None:
        self.fed.append((token, position, room))
        return self.script.pop(0)


def test_sampled_and_chosen_tokens_are_emitted_in_order() -> None:
    a, b, c, d = b"abcd"
    dec = Scripted([one_hot(b), c, one_hot(d)])
    seen: list[int] = []
    params = GenerationParams(max_new_tokens=4)
    ids, finish = decode_loop(dec, one_hot(a), 10, params, 100, TOK, seen.append)
    assert ids == seen == [a, b, c, d] and finish == "length"
    # the last token is not fed; room counts the tokens the turn may take after the fed one
    assert dec.fed == [(a, 10, 3), (b, 11, 2), (c, 12, 1)]


def test_end_of_text_stops_and_is_not_emitted() -> None:
    dec = Scripted([ByteTokenizer.EOS])
    params = GenerationParams(max_new_tokens=8)
    assert decode_loop(dec, one_hot(ord("x")), 0, params, 100, TOK) == ([ord("x")], "stop")


def test_a_stop_string_across_tokens_stops_after_its_last_token() -> None:
    text = b"say ok now"
    dec = Scripted([one_hot(t) for t in text[1:]])
    params = GenerationParams(max_new_tokens=20, stop=("k n",))
    ids, finish = decode_loop(dec, one_hot(text[0]), 0, params, 100, TOK)
    assert bytes(ids) == b"say ok n" and finish == "stop"


def test_a_full_decoder_or_the_last_position_ends_the_turn() -> None:
    a, b = b"ab"
    params = GenerationParams(max_new_tokens=8)
    assert decode_loop(Scripted([None]), one_hot(a), 0, params, 100, TOK) == ([a], "length")
    dec = Scripted([one_hot(b), one_hot(b)])
    assert decode_loop(dec, one_hot(a), 98, params, 100, TOK) == ([a, b], "length")
    assert dec.fed == [(a, 98, 1), (b, 99, 0)]  # 99 is the model's last position


def test_no_new_tokens_feeds_nothing() -> None:
    dec = Scripted([])
    params = GenerationParams(max_new_tokens=0)
    assert decode_loop(dec, one_hot(1), 0, params, 100, TOK) == ([], "length")
    assert dec.fed == []
