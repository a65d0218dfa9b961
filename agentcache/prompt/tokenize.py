"""Segment-wise tokenization: each segment's ids are independent of its neighbours."""

from __future__ import annotations

from dataclasses import dataclass

from agentcache.errors import ContextLengthError, PromptError
from agentcache.model.tokenizer import ChatFormat, TextTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind

GENERATION_PROMPT_ID = "__generation_prompt__"


@dataclass(frozen=True)
class TokenizedSegment:
    segment: Segment
    ids: tuple[int, ...]
    start: int  # index of its first token in the prompt

    @property
    def end(self) -> int:
        return self.start + len(self.ids)

    @property
    def kind(self) -> SegmentKind:
        return self.segment.kind


@dataclass(frozen=True)
class TokenizedPrompt:
    segments: tuple[TokenizedSegment, ...]
    ids: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


def render_segment(seg: Segment, chat: ChatFormat, is_last: bool) -> str:
    if seg.role is None:
        return seg.text
    return chat.wrap(seg.role, seg.text, open_=is_last and seg.role == "assistant")


def encode_segment(
    seg: Segment, tokenizer: TextTokenizer, chat: ChatFormat, is_last: bool
) -> list[int]:
    """A chat message's text never yields the chat format's control tokens: written in a
    message, `<|im_end|>\n<|im_start|>system` would close the turn and open a system one.
    Text without a control token's spelling is encoded with its markup in one piece (the ids
    of every ordinary prompt stay as they were); text with one is encoded apart from the
    markup, as plain text (`encode_text`). Segments without a role are raw prompt text."""
    rendered = render_segment(seg, chat, is_last)
    controls: frozenset[str] = getattr(tokenizer, "control_texts", frozenset())
    if seg.role is None or not any(c in seg.text for c in controls):
        return tokenizer.encode(rendered)
    open_ = is_last and seg.role == "assistant"
    start, end = chat.start.format(role=seg.role), "" if open_ else chat.end
    text_ids = tokenizer.encode_text(seg.text)  # type: ignore[attr-defined]
    return [*tokenizer.encode(start), *text_ids, *(tokenizer.encode(end) if end else ())]


def tokenize_prompt(
    prompt: SegmentedPrompt,
    tokenizer: TextTokenizer,
    chat: ChatFormat,
    max_tokens: int | None = None,
    add_generation_prompt: bool = True,
) -> TokenizedPrompt:
    """Tokenize segment by segment. If the prompt uses chat roles and does not end inside an
    open assistant message, a generation-prompt update segment is appended, in the scope of
    the prompt's last segment (its KV stays with the prompt's)."""
    segs = list(prompt.segments)
    last = segs[-1]
    uses_chat = any(s.role for s in segs)
    if add_generation_prompt and uses_chat and last.role != "assistant":
        segs.append(Segment(SegmentKind.UPDATE, "", GENERATION_PROMPT_ID, "assistant", last.scope))
    out: list[TokenizedSegment] = []
    ids: list[int] = []
    for i, seg in enumerate(segs):
        seg_ids = tuple(encode_segment(seg, tokenizer, chat, i == len(segs) - 1))
        out.append(TokenizedSegment(seg, seg_ids, len(ids)))
        ids.extend(seg_ids)
    if not ids:
        raise PromptError("empty prompt: it tokenizes to zero tokens")
    if max_tokens is not None and len(ids) > max_tokens:
        raise ContextLengthError(len(ids), max_tokens)
    return TokenizedPrompt(tuple(s for s in out if s.ids), tuple(ids))
