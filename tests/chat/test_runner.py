"""ChatEngine on a tiny model: reuse diagnostics name why each segment missed."""

from __future__ import annotations

import pytest

from agentcache.chat.messages import ChatMessage
from agentcache.chat.runner import ChatEngine, ChatRequest
from agentcache.chat.segmenter import ConversationTracker
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.testing import tiny_model

PARAMS = GenerationParams(max_new_tokens=6)


def chat_engine(model: LoadedModel, **kw: object) -> ChatEngine:
    return ChatEngine(Engine(model, EngineConfig(kv_pages=256), **kw))  # type: ignore[arg-type]


def opening(system: str) -> list[ChatMessage]:
    return [ChatMessage("system", system * 4), ChatMessage("user", "first question")]


def statuses(result: object) -> list[tuple[str, str | None]]:
    return [(s.status, s.reason) for s in result.report.segments]  # type: ignore[attr-defined]


def test_second_turn_reuses_the_first_and_names_the_new_reply(tiny: LoadedModel) -> None:
    ce = chat_engine(tiny)
    msgs = opening("You are terse. ")
    r1 = ce.complete(msgs, PARAMS)
    assert r1.report.reused_tokens == 0
    assert statuses(r1) == [("new", "new"), ("new", "new"), ("computed", "generation-prompt")]
    msgs += [r1.message(), ChatMessage("user", "second")]
    r2 = ce.complete(msgs, PARAMS)  # no token: reuse does not depend on the conversation
    # the random model's reply does not round-trip through text, so it was not stored
    assert r1.generation.stats.reply_kv == "retokenized"
    assert statuses(r2) == [
        ("hit", None), ("hit", None), ("new", "new"), ("new", "new"),
        ("computed", "generation-prompt"),
    ]  # fmt: skip
    sys_and_user = sum(s.num_tokens for s in r2.report.segments[:2])
    # the reply's message opens with turn 1's generation prompt, stored in the conversation's
    # scope after this very context: that opening is its head, exact here
    opened = r1.report.segments[-1].num_tokens
    assert r2.report.reused_tokens == r2.report.exact_tokens == sys_and_user + opened
    n = r2.report.segments[2].num_tokens
    assert r2.report.why_no_hit()[0].endswith(f"(assistant #2, {n} tokens): new")


def test_evicted_segment_is_reported_as_evicted(tiny: LoadedModel) -> None:
    ce = chat_engine(tiny)
    a = opening("Agent A. ")
    ce.complete(a, PARAMS)
    ce.engine.store.capacity_bytes = ce.engine.store.stats.bytes  # room for one conversation
    ce.complete(opening("Agent B. "), PARAMS)  # same size: evicts A's oldest segments
    r = ce.complete(a, PARAMS)
    assert statuses(r)[0] == ("evicted", "evicted")
    assert r.report.why_no_hit()[0].endswith("tokens): evicted")
    assert next(s.reason for s in r.report.misses) == "evicted"


def test_other_model_segment_is_reported_as_other_model(tiny: LoadedModel) -> None:
    first = chat_engine(tiny)
    other = tiny_model(seed=1)
    assert other.model_id != tiny.model_id
    second = ChatEngine(
        Engine(other, EngineConfig(kv_pages=256), first.engine.store), first.tracker
    )
    msgs = opening("Shared store. ")
    first.complete(msgs, PARAMS)
    r = second.complete(msgs, PARAMS)
    assert statuses(r)[0] == ("new", "other-model")


def test_full_strategy_reports_segments_as_not_looked_up(tiny: LoadedModel) -> None:
    ce = chat_engine(tiny)
    msgs = opening("Reference. ")
    token = ce.complete(msgs, PARAMS).report.conversation_id
    r = ce.complete(msgs, PARAMS, conversation=token, strategy="full")
    assert r.report.reused_tokens == 0
    assert statuses(r)[0] == ("not-looked-up", "strategy full reuses no segments")


def test_streamed_pieces_add_up_to_the_content(tiny: LoadedModel) -> None:
    ce = chat_engine(tiny)
    pieces: list[str] = []
    req = ChatRequest(tuple(opening("Stream. ")), GenerationParams(max_new_tokens=16))
    r = ce.run(ce.prepare(req), on_text=pieces.append)
    assert "".join(pieces) == r.content == r.text
    assert len(r.generation.token_ids) == r.completion_tokens > 0


@pytest.mark.parametrize(("isolate", "status"), [(True, "new"), (False, "moved")])
def test_conversations_reuse_each_others_messages_unless_isolated(
    tiny: LoadedModel, isolate: bool, status: str
) -> None:
    ce = ChatEngine(Engine(tiny, EngineConfig(kv_pages=256)), ConversationTracker(isolate=isolate))
    system = ChatMessage("system", "Agent. " * 4)
    b1 = [system, ChatMessage("user", "task B")]
    first = ce.complete(b1, PARAMS)
    reply, b = first.message(), first.report.conversation_id  # not stored: retokenized
    # A sends the very same text (stored under A's scope, or the tenant's by default)
    ce.complete([system, ChatMessage("user", "task A"), reply, ChatMessage("user", "more")],
                PARAMS)  # fmt: skip
    r = ce.complete([*b1, reply, ChatMessage("user", "next")], PARAMS, conversation=b)
    seg = next(s for s in r.report.segments if s.message_index == 2)
    assert (seg.kind, seg.status) == ("fixed", status)
    assert statuses(r)[0] == ("hit", None)  # the system prefix is shared either way
