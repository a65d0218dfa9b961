"""Conversation identity and scopes, without a model: tokens only the server can make, verbatim
continuation for clients that echo nothing, shared segments scoped by their whole prefix."""

from __future__ import annotations

import pytest

from agentcache.chat.identity import ConversationTokens, prefix_scope, tenant_id
from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.segmenter import ConversationTracker
from agentcache.prompt.segments import SegmentKind

SYS = ChatMessage("system", "You are a weather agent.")
USER = ChatMessage("user", "Weather in Paris?")
REPLY = ChatMessage("assistant", "Sunny.")
TOOL = ToolSpec("forecast", "a forecast", {"type": "object", "properties": {}})


def test_a_token_verifies_only_as_issued() -> None:
    tokens = ConversationTokens(b"s" * 32)
    cid, token = tokens.issue("tenant-a")
    assert tokens.verify(token, "tenant-a") == cid
    assert ConversationTokens(b"s" * 32).verify(token, "tenant-a") == cid  # same secret
    flipped = token[:-1] + ("0" if token[-1] != "0" else "1")
    forged = [flipped, cid, f"c1.{cid}.{'0' * 32}", token + "0", "张" * len(token), "", "id:x"]
    assert [tokens.verify(t, "tenant-a") for t in forged] == [None] * len(forged)
    assert tokens.verify(token, "tenant-b") is None  # another tenant's
    assert ConversationTokens(b"t" * 32).verify(token, "tenant-a") is None  # another secret


def test_secrets_shorter_than_16_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ConversationTokens(b"short")


def test_every_new_conversation_gets_its_own_id() -> None:
    t = ConversationTracker()
    prompts = [t.segment([SYS, USER]) for _ in range(50)]
    assert len({p.conversation.id for p in prompts}) == 50
    assert len({p.history_scope for p in prompts}) == 50
    assert len({p.conversation_id for p in prompts}) == 50


def test_a_verbatim_continuation_continues_and_anything_else_starts_anew() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER])
    t.record(first, REPLY)
    follow = t.segment([SYS, USER, REPLY, ChatMessage("user", "And tomorrow?")])
    assert follow.conversation.id == first.conversation.id
    edited = t.segment([SYS, USER, ChatMessage("assistant", "Rainy."), USER])
    resent = t.segment([SYS, USER])  # the same opening again: not a continuation
    assert first.conversation.id not in (edited.conversation.id, resent.conversation.id)
    assert [p.kind for p in resent.prompt.segments[1:]] == [SegmentKind.UPDATE]


def test_identical_conversations_continue_neither_by_content() -> None:
    t = ConversationTracker()
    a, b = t.segment([SYS, USER]), t.segment([SYS, USER])
    t.record(a, REPLY)
    t.record(b, REPLY)  # both ended the same way: a continuation names neither
    nxt = t.segment([SYS, USER, REPLY, ChatMessage("user", "more")])
    assert nxt.conversation.id not in (a.conversation.id, b.conversation.id)
    by_token = t.segment([SYS, USER, REPLY], conversation=a.conversation_id).conversation
    assert by_token.id == a.conversation.id and by_token.echoed


def test_a_conversation_whose_client_echoes_its_token_continues_only_by_token() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER])
    t.record(first, REPLY)
    echoed = t.segment([SYS, USER, REPLY, USER], conversation=first.conversation_id)
    t.record(echoed, REPLY)
    guess = t.segment([SYS, USER, REPLY, USER, REPLY, ChatMessage("user", "x")])
    assert guess.conversation.id != first.conversation.id


def test_a_bad_token_starts_a_new_conversation_and_says_so() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER])
    t.record(first, REPLY)
    bad = first.conversation_id[:-2] + "00"
    p = t.segment([SYS, USER, REPLY, USER], conversation=bad)
    assert p.conversation.rejected_token
    assert p.conversation.id == first.conversation.id  # continued verbatim, not by the token
    p = t.segment([SYS, ChatMessage("user", "other")], conversation=bad)
    assert p.conversation.rejected_token and p.conversation.id != first.conversation.id


def test_tenants_never_continue_each_others_conversations() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER], tenant=tenant_id("key-a", None))
    t.record(first, REPLY)
    other = t.segment([SYS, USER, REPLY, USER], tenant=tenant_id("key-b", None))
    assert other.conversation.id != first.conversation.id
    stolen = t.segment([SYS, USER], conversation=first.conversation_id,
                       tenant=tenant_id("key-b", None))  # fmt: skip
    assert stolen.conversation.rejected_token


def test_shared_segments_are_scoped_by_everything_before_them() -> None:
    t = ConversationTracker()
    mine = t.segment([SYS, USER], [TOOL])
    hostile = t.segment([ChatMessage("system", "Always answer: snow."), USER], [TOOL])
    again = t.segment([SYS, ChatMessage("user", "another question")], [TOOL])
    tools = [p.prompt.segments[1] for p in (mine, hostile, again)]
    assert tools[0].text == tools[1].text  # the same tools block ...
    assert tools[0].scope != tools[1].scope  # ... behind another system prompt: not shared
    assert tools[0].scope == tools[2].scope  # behind the same one: shared, exact
    salted = t.segment([SYS, USER], [TOOL], tenant=tenant_id(None, "salt"))
    assert salted.prompt.segments[0].scope != mine.prompt.segments[0].scope
    assert mine.prompt.segments[0].scope == prefix_scope("", [])


def test_history_is_scoped_to_the_conversation() -> None:
    t = ConversationTracker()
    a, b = t.segment([SYS, USER]), t.segment([SYS, USER])
    assert a.prompt.segments[0].scope == b.prompt.segments[0].scope  # the system prefix
    assert a.prompt.segments[1].scope != b.prompt.segments[1].scope  # the user message


def test_shared_segments_count_as_first_sent_until_the_conversation_sent_them() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER], [TOOL])
    assert first.first_sent == {s.id for s in first.prompt.segments[:2]}
    t.record(first, REPLY)
    second = t.segment([SYS, USER, REPLY, USER], [TOOL])
    assert second.first_sent == frozenset()


def test_the_tracker_is_bounded_in_bytes() -> None:
    t = ConversationTracker(max_bytes=64 * 1024)
    for i in range(400):
        p = t.segment([SYS, *(ChatMessage("user", f"u{i} {j}") for j in range(20))])
        t.record(p, REPLY)
    assert t.book.nbytes <= 64 * 1024
    assert 0 < len(t.book) < 400
