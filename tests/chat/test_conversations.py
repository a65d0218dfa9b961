"""Conversation identity and scopes, without a model: tokens only the server can make and hands
only to the conversation's creator, history scoped to the tenant (or, isolated, to the
conversation), `prompt_cache_key` groups that label but never scope."""

from __future__ import annotations

import pytest

from agentcache.chat.identity import ConversationTokens, prefix_scope, tenant_id
from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.segmenter import ConversationTracker, tenant_scope
from agentcache.prompt.segments import SegmentKind

SYS = ChatMessage("system", "You are a weather agent.")
USER = ChatMessage("user", "Weather in Paris?")
REPLY = ChatMessage("assistant", "Sunny.")
TOOL = ToolSpec("forecast", "a forecast", {"type": "object", "properties": {}})
KEY_A, KEY_B = tenant_id("key-a", None), tenant_id("key-b", None)


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


def test_every_request_without_a_token_gets_a_conversation_of_its_own() -> None:
    t = ConversationTracker()
    prompts = [t.segment([SYS, USER]) for _ in range(50)]
    assert len({p.conversation.id for p in prompts}) == 50
    assert len({p.conversation_id for p in prompts}) == 50
    assert {p.history_scope for p in prompts} == {tenant_scope("")}  # reuse: the tenant's


def test_replaying_a_conversation_verbatim_never_obtains_its_token() -> None:
    t = ConversationTracker()
    victim = t.segment([SYS, USER])
    t.record(victim, REPLY)
    replay = t.segment([SYS, USER, REPLY, ChatMessage("user", "And tomorrow?")])
    assert replay.conversation.id != victim.conversation.id
    assert replay.conversation_id != victim.conversation_id
    t.record(replay, REPLY)
    # the victim's next turn, with its token, is still its conversation, labels and all
    mine = t.segment([SYS, ChatMessage("user", "Weather in Lyon?")],
                     conversation=victim.conversation_id)  # fmt: skip
    assert mine.conversation.id == victim.conversation.id and mine.conversation.echoed
    assert [p.changed for p in mine.plan] == [False, True]


def test_a_bad_token_starts_a_new_conversation_and_says_so() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER])
    t.record(first, REPLY)
    token = first.conversation_id
    bad = token[:-1] + ("1" if token[-1] == "0" else "0")  # its MAC altered, always
    p = t.segment([SYS, USER, REPLY, USER], conversation=bad)
    assert p.conversation.rejected_token and p.conversation.id != first.conversation.id
    assert not any(pl.changed for pl in p.plan)  # nothing to compare with


def test_tenants_never_continue_each_others_conversations() -> None:
    t = ConversationTracker()
    first = t.segment([SYS, USER], tenant=KEY_A)
    t.record(first, REPLY)
    stolen = t.segment([SYS, USER], conversation=first.conversation_id, tenant=KEY_B)
    assert stolen.conversation.rejected_token
    assert stolen.conversation.id != first.conversation.id


def test_history_is_scoped_to_the_tenant_by_default() -> None:
    t = ConversationTracker()
    a, b = t.segment([SYS, USER], [TOOL]), t.segment([SYS, USER], [TOOL])
    assert [s.scope for s in a.prompt.segments] == [tenant_scope("")] * 3
    assert [s.scope for s in b.prompt.segments] == [s.scope for s in a.prompt.segments]
    assert [s.kind for s in a.prompt.segments] == [SegmentKind.SYSTEM] * 2 + [SegmentKind.FIXED]
    for tenant in (KEY_A, KEY_B, tenant_id(None, "salt"), tenant_id("key-a", "salt")):
        other = t.segment([SYS, USER], [TOOL], tenant=tenant)
        assert {s.scope for s in other.prompt.segments} == {tenant_scope(tenant)}
    scopes = {tenant_scope(x) for x in ("", KEY_A, KEY_B, tenant_id(None, "salt"))}
    assert len(scopes) == 4


def test_isolated_history_is_scoped_to_the_conversation() -> None:
    t = ConversationTracker(isolate=True)
    a, b = t.segment([SYS, USER]), t.segment([SYS, USER])
    assert a.prompt.segments[0].scope == b.prompt.segments[0].scope  # the system prefix
    assert a.prompt.segments[1].scope != b.prompt.segments[1].scope  # the user message
    t.record(a, REPLY)
    again = t.segment([SYS, USER, REPLY, USER], conversation=a.conversation_id)
    assert again.prompt.segments[1].scope == a.prompt.segments[1].scope
    assert t.reply_segment(a, REPLY).scope == again.prompt.segments[2].scope


def test_isolated_static_segments_are_scoped_by_everything_before_them() -> None:
    t = ConversationTracker(isolate=True)
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


def test_a_prompt_cache_key_groups_labels_within_its_tenant_only() -> None:
    t = ConversationTracker()
    memory = [ChatMessage("system", f"memory v{i}") for i in range(3)]
    first = t.segment([memory[0], USER], cache_key="agent-1")
    t.record(first, REPLY)
    edited = t.segment([memory[1], USER, REPLY, USER], cache_key="agent-1")
    assert [p.changed for p in edited.plan] == [True, False, False, False]
    assert edited.conversation.id != first.conversation.id  # a group hands out no token
    for other in (
        t.segment([memory[2], USER], cache_key="agent-2"),  # another group
        t.segment([memory[2], USER]),  # no group, no token
        t.segment([memory[2], USER], cache_key="agent-1", tenant=KEY_A),  # another tenant's
    ):
        assert not any(p.changed for p in other.plan)
    # the key scopes nothing: every request of the tenant shares one scope
    assert first.history_scope == edited.history_scope == tenant_scope("")


def test_the_tracker_is_bounded_in_bytes() -> None:
    t = ConversationTracker(max_bytes=64 * 1024)
    for i in range(400):
        p = t.segment([SYS, *(ChatMessage("user", f"u{i} {j}") for j in range(20))])
        t.record(p, REPLY)
    assert t.book.nbytes <= 64 * 1024
    assert 0 < len(t.book) < 400
