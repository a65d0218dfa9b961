"""Edited histories on a tiny model, as an unmodified client sends them (no token, no
cooperation): a system prompt rewritten every turn, cleared tool results, compaction, retries,
rebuilt lists, subagents. Every unchanged message is found; only changed and new text is
computed, besides what the strategy recomputes for fidelity (`refreshed`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from agentcache.chat.diagnostics import ReuseReport
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatEngine, ChatRequest, ChatResult
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.runtime.stats import TokenReuse, TokenUse
from agentcache.testing import scripted_sampler

PARAMS = GenerationParams(max_new_tokens=48)
SYSTEM = "You are a support agent. Keep answers short. Use the tools. " * 2
LS = ToolSpec("ls", "list files", {"type": "object", "properties": {"path": {"type": "string"}}})
FOUND = ("hit", "moved")


def found(report: ReuseReport, indices: set[int]) -> tuple[int, int]:
    """(found tokens, all tokens) of the segments of messages `indices`."""
    segs = [s for s in report.segments if s.message_index in indices]
    hit = sum((s.exact_tokens or 0) + (s.moved_tokens or 0) + (s.refreshed_tokens or 0)
              for s in segs)  # fmt: skip
    return hit, sum(s.num_tokens for s in segs)


@pytest.fixture
def chat(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """`chat(messages, reply, **request)`: one turn whose reply is `reply` (scripted, so it
    round-trips through text as a real model's does and its KV is stored)."""
    engine = ChatEngine(Engine(tiny, EngineConfig(kv_pages=512)))

    def run(messages: list[ChatMessage], reply: str = "Done.", **request: Any) -> ChatResult:
        monkeypatch.setattr(loop_module, "sample", scripted_sampler(reply))
        req = ChatRequest(tuple(messages), PARAMS, **request)
        return engine.run(engine.prepare(req))

    yield run


def memory(turn: int) -> ChatMessage:
    facts = "\n".join(f"- ticket {i}: customer {i} reported issue {i * 7}" for i in range(turn))
    return ChatMessage("system", f"{SYSTEM}\n<core_memory>\n{facts}\n</core_memory>")


def test_a_system_prompt_rewritten_every_turn_keeps_the_history(chat: Any) -> None:
    """MemGPT: working memory in the system message, rewritten (and longer) every turn. From
    the second turn on, >= 80% of the history's tokens are found, whatever the position."""
    history: list[ChatMessage] = []
    for turn in range(5):
        user = ChatMessage("user", f"Ticket {turn}: my order {turn * 11} has not arrived yet.")
        messages = [memory(turn), *history, user]
        r = chat(messages, f"Logged ticket {turn}; I will check order {turn * 11}.",
                 cache_key="support-agent")  # fmt: skip
        if turn > 0:
            got, total = found(r.report, set(range(1, len(messages) - 1)))
            assert got >= 0.8 * total, (turn, got, total)
            assert r.report.segments[0].status == "changed"  # by the prompt_cache_key group
            assert r.report.reused_tokens >= got
        history += [user, r.message()]


def test_cleared_tool_results_compaction_retries_and_rebuilt_lists(chat: Any) -> None:
    call = ChatMessage("assistant", "", (ToolCall("c1", "ls", {"path": "src"}),))
    listing = ChatMessage("tool", "\n".join(f"src/module_{i}.py" for i in range(12)))
    base = [ChatMessage("system", SYSTEM), ChatMessage("user", "What is in src?"), call,
            listing]  # fmt: skip
    answer = chat(base, "Twelve modules.", tools=(LS,)).message()
    ask = ChatMessage("user", "Which one is the largest?")
    full = [*base, answer, ask]
    chat(full, "module_3.py.", tools=(LS,))
    cleared = ChatMessage("tool", "[tool result cleared]")
    summary = ChatMessage("user", "Summary so far: src holds twelve modules.")
    edits: dict[str, tuple[list[ChatMessage], set[int]]] = {
        # the edited list, and the indices of its messages that are new text
        "cleared": ([*base[:3], cleared, answer, ask], {3}),
        "compacted": ([base[0], summary, ask], {1}),
        "retried": (full, set()),
        "rebuilt": (
            [*base[:2], ChatMessage("assistant", "", call.tool_calls), listing, answer, ask],
            set(),
        ),
        "inserted": (
            [*base[:2], ChatMessage("user", "Only .py files."), *base[2:], answer, ask],
            {2},
        ),
    }
    for name, (messages, new) in edits.items():
        r = chat(messages, "ok", tools=(LS,))
        for s in r.report.segments:
            if s.message_index is None:
                continue
            expected = ("new",) if s.message_index in new else FOUND
            assert s.status in expected, (name, s)
        # computed: the new text (less an opening it shares with a message stored after the
        # same context: its head, reused exactly), the generation prompt, and nothing else
        # found-and-wasted
        fresh = sum(s.num_tokens - (s.exact_tokens or 0) for s in r.report.segments
                    if s.status not in FOUND)  # fmt: skip
        assert r.report.computed_tokens == fresh, name


def test_subagents_and_agents_reading_one_document_reuse_each_other(chat: Any) -> None:
    doc = ChatMessage("user", "Design document:\n" + "The cache keys KV by content. " * 20)
    parent = [ChatMessage("system", SYSTEM), doc, ChatMessage("user", "Plan the work.")]
    chat(parent, "Step 1: review.", tools=(LS,))
    # a subagent: the parent's system prompt, tools and document, then its own task
    sub = chat([*parent[:2], ChatMessage("user", "Review section 2.")], tools=(LS,))
    assert [s.status for s in sub.report.segments[:3]] == ["hit", "hit", "hit"]  # exact
    # another agent, its own system prompt, reading the same document: found, moved
    other = chat([ChatMessage("system", "You are a reviewer."), doc,
                  ChatMessage("user", "Find mistakes.")])  # fmt: skip
    doc_seg = next(s for s in other.report.segments if s.message_index == 1)
    assert doc_seg.status == "moved" and doc_seg.num_tokens > 100


@pytest.mark.parametrize(
    "strategy", ["rpdc", "pic", "epic", "cacheblend", "cacheslide", "prefix", "promptcache", "full"]
)
def test_the_token_split_adds_up_under_every_strategy(chat: Any, strategy: str) -> None:
    history: list[ChatMessage] = []
    for turn in range(3):
        user = ChatMessage("user", f"Ticket {turn}: order {turn * 11} is late.")
        r = chat([memory(turn), *history, user], f"Logged {turn}.", strategy=strategy)
        history += [user, r.message()]
        rep = r.report
        split = (rep.exact_tokens, rep.moved_tokens, rep.refreshed_tokens, rep.computed_tokens)
        assert None not in split and sum(s or 0 for s in split) == rep.prompt_tokens
        assert sum(s or 0 for s in split[:3]) == rep.reused_tokens
        per_segment = sum((s.exact_tokens or 0) + (s.moved_tokens or 0)
                          + (s.refreshed_tokens or 0) for s in rep.segments)  # fmt: skip
        assert per_segment == rep.reused_tokens
        if strategy == "full" or turn == 0:
            assert rep.reused_tokens == 0
        elif strategy != "promptcache":  # it keys by absolute position: the memory moved all
            assert rep.reused_tokens > 0


def test_the_token_split_of_a_prefill_matches_a_token_by_token_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 64):
        reused, exact, dirty = (torch.rand(n, generator=gen) < 0.6 for _ in range(3))
        runs = TokenReuse.of(n, reused, exact, dirty).runs
        got = [use for s, e, use in runs for _ in range(s, e)]
        expected = [
            TokenUse.COMPUTED if not r else TokenUse.REFRESHED if d else
            TokenUse.EXACT if x else TokenUse.MOVED
            for r, x, d in zip(reused.tolist(), exact.tolist(), dirty.tolist(), strict=True)
        ]  # fmt: skip
        assert got == expected
        assert all(a[2] != b[2] and a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert TokenReuse.of(3, None, None, None).runs == ((0, 3, TokenUse.COMPUTED),)


CLEARED = "[Old tool result content cleared]"


def test_every_cleared_result_is_found_where_it_sits_on_the_next_request(chat: Any) -> None:
    """Context editing gives every cleared tool result the same text. The request after the
    clearing one only appends: each placeholder is then found at its place, exact or as the
    clearing turn used it, none recomputed as text computed elsewhere (the store holds one
    copy per text at its first place, and each later occurrence beside it: reuse/segments.py
    "Repeated texts")."""
    system, ask = ChatMessage("system", SYSTEM), ChatMessage("user", "List src, tests, docs.")
    history: list[ChatMessage] = [system, ask]
    for i, folder in enumerate(("src", "tests", "docs")):
        call = ChatMessage("assistant", "", (ToolCall(f"c{i}", "ls", {"path": folder}),))
        out = "\n".join(f"{folder}/file_{k}.py" for k in range(10))
        history += [call, ChatMessage("tool", out)]
    chat(history, "Three folders.", tools=(LS,))
    cleared = [ChatMessage("tool", CLEARED) if m.role == "tool" else m for m in history]
    clearing = chat(cleared, "Done listing.", tools=(LS,))
    appended = [*cleared, clearing.message(), ChatMessage("user", "Which is largest?")]
    r = chat(appended, "src.", tools=(LS,))
    places = [i for i, m in enumerate(appended) if m.role == "tool"]
    assert len(places) == 3
    for s in (s for s in r.report.segments if s.message_index in places):
        assert s.status in FOUND, s
        assert s.refreshed_tokens == 0 and (s.exact_tokens or 0) + (s.moved_tokens or 0) == (
            s.num_tokens
        ), s
