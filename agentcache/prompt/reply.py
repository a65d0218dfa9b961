"""A reply in next turn's form: the prompt with the reply's closed assistant message in place of
its generation prompt, so the reply's KV, computed at generation, can be stored as a segment.

    this turn   [ segments ... | generation prompt | generated ids ...                 ]
    next turn   [ segments ... | closed message: generation prompt + reply + closing ]

The closed message's first tokens are the generation prompt's and the generated ones when the
reply's text tokenizes back to them; the closing tokens (e.g. `<|im_end|>`) follow.
"""

from __future__ import annotations

from agentcache.model.tokenizer import ChatFormat, TextTokenizer
from agentcache.prompt.segments import Segment
from agentcache.prompt.tokenize import (
    GENERATION_PROMPT_ID,
    TokenizedPrompt,
    TokenizedSegment,
    encode_segment,
)


def close_reply(
    prompt: TokenizedPrompt, reply: Segment, tokenizer: TextTokenizer, chat: ChatFormat
) -> TokenizedPrompt | None:
    """`prompt` with `reply` as a closed message in place of its generation prompt; None when
    `prompt` does not end in the generation prompt (e.g. it ends in a prefilled reply)."""
    head = prompt.segments[-1]
    if head.segment.id != GENERATION_PROMPT_ID:
        return None
    closed = tuple(encode_segment(reply, tokenizer, chat, is_last=False))
    segments = (*prompt.segments[:-1], TokenizedSegment(reply, closed, head.start))
    return TokenizedPrompt(segments, prompt.ids[: head.start] + closed)
