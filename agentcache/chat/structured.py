"""Structured outputs: a reply held to a JSON Schema (or to a forced tool call's arguments) by
constrained decoding with llguidance.

    OutputFormat (what the request asks, a frozen value)
      -> compile_format: the grammar (llguidance), checked; SchemaError names what it cannot do
      -> GrammarConstraint (one per reply): the runtime's `TokenConstraint`; each step it
         consumes the reply's new ids and masks every token the grammar forbids next

llguidance over xgrammar: llguidance is one abi3 wheel with no dependencies (xgrammar pulls
triton and apache-tvm-ffi), computes a mask in tens of microseconds on CPU without a
per-schema precompile, and its JSON Schema coverage is the wider (docs/server.md,
docs/bench/server/structured/).

A forced call's arguments: the reply is prefilled with `<tool_call>\\n{"name": ..., "arguments": `
(chat/tools.py), so its grammar is the tool's parameters as JSON, then `}` and the closing tag.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from agentcache.chat.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from agentcache.errors import PromptError

# compact JSON: no free whitespace between tokens, so a small max_tokens holds more of it
JSON_OPTIONS: Any = {"whitespace_flexible": False}


class SchemaError(PromptError):
    """A format that cannot be enforced (a schema the grammar library cannot compile: the
    message names the construct); `param` names the request field that asked for it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class OutputFormat:
    """`kind`: "json_schema" (with `schema`), "json_object" or "tool_args" (the forced call's
    parameters, with `schema`); `param`: the request field that asked for it (errors name it).
    `or_call`: a tool call may come instead of the JSON (tools offered, none forced)."""

    kind: str
    schema: Mapping[str, Any] | None = None
    param: str | None = None
    or_call: bool = False

    def grammar(self) -> str:
        import llguidance

        body = {"type": "object"} if self.kind == "json_object" else dict(self.schema or {})
        schema = json.dumps({**body, "x-guidance": JSON_OPTIONS})
        if self.kind == "tool_args":
            close = json.dumps("}\n" + TOOL_CALL_CLOSE)
            lark = f"start: args {close}\nargs: %json {schema}\n"
        elif self.or_call:  # the JSON, or a tool call in the chat format (tools.py)
            lark = f"start: answer | call\nanswer: %json {schema}\n"
            lark += f"call: {json.dumps(TOOL_CALL_OPEN)} /(.|\\n)*/\n"
        else:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        return llguidance.LLMatcher.grammar_from_lark(lark)


class Grammars:
    """Compiles formats against one tokenizer (its llguidance form is built once, ~1 s for a
    real vocabulary). Thread-safe."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._source, self.vocab_size = tokenizer, vocab_size
        self._lock = threading.Lock()
        self._tok: Any = None

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tok is None:
                self._tok = _ll_tokenizer(self._source, self.vocab_size)
            return self._tok

    def constraint(self, fmt: OutputFormat) -> GrammarConstraint:
        """A fresh constraint for one reply; SchemaError when the format does not compile."""
        import llguidance

        try:
            grammar = fmt.grammar()
        except ValueError as e:
            raise SchemaError(f"{fmt.param}: not a JSON Schema: {e}", fmt.param) from None
        tok = self.tokenizer()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tok)
        if is_error:
            msg = f"{fmt.param}: the schema cannot be enforced: {_short(messages[0])}"
            raise SchemaError(msg, fmt.param)
        eos = min(self._source.eos_token_ids)
        return GrammarConstraint(llguidance.LLMatcher(tok, grammar), self.vocab_size, eos)


def _short(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _ll_tokenizer(tok: Any, vocab_size: int) -> Any:
    import llguidance

    inner = getattr(tok, "_tok", None)
    eos = sorted(tok.eos_token_ids)
    if inner is not None:  # a transformers tokenizer (HFTokenizer)
        import llguidance.hf

        return llguidance.hf.from_tokenizer(inner, n_vocab=vocab_size, eos_token=eos)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocab(tok, vocab_size)))


class _ByteVocab:
    """A byte-level tokenizer (one id per byte, ids past 255 special) as llguidance reads one."""

    def __init__(self, tok: Any, vocab_size: int) -> None:
        self.eos_token_id = min(tok.eos_token_ids)
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)]
        self.tokens += [f"<|special_{i}|>".encode() for i in range(256, vocab_size)]
        self.special_token_ids = list(range(256, vocab_size))
        self._tok = tok

    def __call__(self, s: bytes | str) -> list[int]:
        return list(s.encode() if isinstance(s, str) else s)


class GrammarConstraint:
    """The runtime's `TokenConstraint` over an llguidance matcher. Tokens that reached the
    reply without its mask (a test's scripted sampler, a decoder that chose them) and broke
    the grammar are counted in `violations`; from then on only end of text is allowed."""

    def __init__(self, matcher: Any, vocab_size: int, eos: int) -> None:
        self._matcher, self.vocab_size, self.eos = matcher, vocab_size, eos
        self._seen = 0
        self.violations = 0
        self.mask_calls = 0
        words = (vocab_size + 31) // 32
        self._bits = np.full(words, -1, dtype=np.int32)

    def allowed(self, ids: Sequence[int], logits: Tensor) -> Tensor:
        vocab_size = logits.shape[-1]
        m = self._matcher
        for token in ids[self._seen :]:
            if not m.is_error() and not m.consume_token(int(token)):
                self.violations += 1
        self._seen = len(ids)
        self.mask_calls += 1
        if m.is_error():
            return self._only_eos(vocab_size)
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:vocab_size]
        out = torch.from_numpy(bits.astype(np.bool_))
        if out.shape[0] < vocab_size:
            out = torch.cat([out, torch.zeros(vocab_size - out.shape[0], dtype=torch.bool)])
        return out

    def _only_eos(self, vocab_size: int) -> Tensor:
        out = torch.zeros(vocab_size, dtype=torch.bool)
        out[self.eos] = True
        return out
