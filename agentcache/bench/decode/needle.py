"""Needle prompts for `agentcache bench-decode`: essay text with a planted passphrase, ending
in the question that asks for it."""

from __future__ import annotations

from agentcache.heads.prompts import token_prompts, tokenized_prompt
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt

NEEDLE = " The secret passphrase for the archive is blue-harbor-7319. "
QUESTION = (
    "\n\nQuestion: what is the secret passphrase for the archive?\n"
    "Answer: The secret passphrase for the archive is"
)
SECRET = "7319"


def needle_prompt(model: LoadedModel, texts: list[str], num_tokens: int) -> TokenizedPrompt:
    """`num_tokens` tokens: essay text with NEEDLE planted halfway, ending in QUESTION."""
    return needle_prompts(model, texts, num_tokens, 1, (0.5,))[0]


def needle_prompts(
    model: LoadedModel,
    texts: list[str],
    num_tokens: int,
    count: int,
    depths: tuple[float, ...] | None = None,
) -> list[TokenizedPrompt]:
    """`count` needle prompts of `num_tokens` tokens on haystacks cut as in `token_prompts`,
    the needle at `depths` (default spread over 0.1..0.9 of the haystack)."""
    if count == 0:
        return []
    enc = model.tokenizer.encode
    needle, question = enc(NEEDLE), enc(QUESTION)
    hay = token_prompts(model, texts, num_tokens - len(needle) - len(question), count)
    depths = depths or tuple(0.1 + 0.8 * i / max(count - 1, 1) for i in range(count))
    cuts = [round(h.num_tokens * d) for h, d in zip(hay, depths, strict=True)]
    return [tokenized_prompt(model, [*h.ids[:c], *needle, *h.ids[c:], *question])
            for h, c in zip(hay, cuts, strict=True)]  # fmt: skip
