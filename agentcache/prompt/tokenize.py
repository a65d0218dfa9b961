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


def tokenize_prompt(
    prompt: SegmentedPrompt,
    tokenizer: TextTokenizer,
    chat: ChatFormat,
    max_tokens: int | None = None,
    add_generation_prompt: bool = True,
) -> TokenizedPrompt:
    """Tokenize segment by segment. If the prompt uses chat roles and does not end inside an
    open assistant message, a generation-prompt update segment is appended."""
    segs = list(prompt.segments)
    last = segs[-1]
    uses_chat = any(s.role for s in segs)
    if add_generation_prompt and uses_chat and last.role != "assistant":
        segs.append(Segment(SegmentKind.UPDATE, "", GENERATION_PROMPT_ID, "assistant"))
    out: list[TokenizedSegment] = []
    ids: list[int] = []
    for i, seg in enumerate(segs):
        seg_ids = tuple(tokenizer.encode(render_segment(seg, chat, i == len(segs) - 1)))
        out.append(TokenizedSegment(seg, seg_ids, len(ids)))
        ids.extend(seg_ids)
    if not ids:
        raise PromptError("empty prompt: it tokenizes to zero tokens")
    if max_tokens is not None and len(ids) > max_tokens:
        raise ContextLengthError(len(ids), max_tokens)
    return TokenizedPrompt(tuple(s for s in out if s.ids), tuple(ids))
