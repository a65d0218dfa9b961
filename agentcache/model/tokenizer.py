"""Tokenizers behind one small protocol, plus per-message chat formats.

Segments are tokenized one by one and their ids concatenated, so a segment's ids never depend
on its neighbours; chat markup is applied per segment by a `ChatFormat`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class TextTokenizer(Protocol):
    tokenizer_id: str
    eos_token_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """Wraps a `transformers` tokenizer; never adds BOS/EOS on its own."""

    def __init__(self, tok: Any, name: str) -> None:
        self._tok = tok
        backend = getattr(tok, "backend_tokenizer", None)
        blob = backend.to_str() if backend is not None else repr(sorted(tok.get_vocab().items()))
        self.tokenizer_id = f"{name}#{hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()}"
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        for special in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
            tid = tok.convert_tokens_to_ids(special)
            if isinstance(tid, int) and tid != tok.unk_token_id:
                eos.add(tid)
        self.eos_token_ids = frozenset(eos)
        self.vocab = tok.get_vocab()
        # spellings the tokenizer turns into control ids wherever they occur in text
        self.control_texts = frozenset(
            t.content for t in tok.added_tokens_decoder.values() if t.special
        )

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_text(self, text: str) -> list[int]:
        """`text` as plain text: a control token's spelling in it gives ordinary ids."""
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


class ByteTokenizer:
    """One id per UTF-8 byte, plus an end-of-text id. For tiny test models (vocab >= 257)."""

    EOS = 256

    def __init__(self) -> None:
        self.tokenizer_id = "bytes-v1"
        self.eos_token_ids = frozenset({self.EOS})
        self.vocab = {"<|im_start|>": -1}  # marks ChatML as this tokenizer's chat format

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ChatFormat:
    """How one chat message is wrapped. `open` leaves a trailing assistant message unterminated."""

    name: str
    start: str  # with {role}
    end: str
    renames: tuple[tuple[str, str], ...] = ()  # role -> the name the model was trained on

    def role(self, role: str) -> str:
        return dict(self.renames).get(role, role)

    def wrap(self, role: str, text: str, open_: bool = False) -> str:
        return self.start.format(role=self.role(role)) + text + ("" if open_ else self.end)

    def generation_prompt(self) -> str:
        return self.start.format(role=self.role("assistant"))


CHATML = ChatFormat("chatml", "<|im_start|>{role}\n", "<|im_end|>\n")
LLAMA3 = ChatFormat("llama3", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>")
# Gemma has no system role: a system message is a user turn of its own
GEMMA = ChatFormat(
    "gemma", "<start_of_turn>{role}\n", "<end_of_turn>\n",
    (("assistant", "model"), ("system", "user")),
)  # fmt: skip
PLAIN = ChatFormat("plain", "{role}: ", "\n")


def chat_format_for(vocab: dict[str, int]) -> ChatFormat:
    if "<|im_start|>" in vocab:
        return CHATML
    if "<|start_header_id|>" in vocab:
        return LLAMA3
    if "<start_of_turn>" in vocab:
        return GEMMA
    return PLAIN
