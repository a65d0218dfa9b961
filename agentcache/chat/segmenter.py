"""Chat messages -> segmented prompt, every message looked up by its content within a scope.

    messages:  [system][tools][user 1][assistant 1][tool 1] ... [user n]   (+ prefill)
    segments:  system  system  fixed   fixed        fixed   ...  fixed  [assistant: update]
               |-- static prefix --| |-- history: found wherever it now sits (re-rotated) --|

Every message is a fixed segment whose id comes from a fingerprint of its role and text, so a
message keeps its id, and is found, wherever it moves: behind a rewritten system prompt
(working memory), after a cleared tool result, a compacted span, a retried or rebuilt turn.
What is not in the store is computed (a miss, reported `new`, `changed` or `evicted`); only the
generation prompt is an update segment (computed by design). A prefill (the reply's first text,
e.g. a forced tool call's opening) is the generation prompt's text: the reply continues it, and
is stored after generation as the closed message the client sends back, prefill included.

Scopes (`Segment.scope`; the store keys a segment by its tokens within its scope):
- by default the tenant (identity.tenant_id: API key + cache_salt): any message stored for the
  tenant is reused by any of its requests, whatever conversation computed it. KV computed
  behind another context is approximate where it is reused; the strategy recomputes what it
  must for fidelity. Across tenants nothing is shared, not even an identical system prompt;
- with `isolate`, the conversation: history is reused only by requests that echo the
  conversation's token, so a conversation's outputs do not depend on other traffic. The static
  prefix (leading system messages, the tools block) is then shared by the tenant's
  conversations, each segment scoped by everything before it (`prefix_scope`): KV found there
  was computed from an identical token prefix, so it is exact.

Conversations (conversations.py) serve reports: a message is `changed` when the previous
request of its conversation (or its `prompt_cache_key` group) had another message at its index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from agentcache.chat.conversations import Conversation, ConversationBook, group_key
from agentcache.chat.identity import ConversationTokens, digest, prefix_scope
from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.tools import format_tool_call, render_tools
from agentcache.errors import PromptError
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import GENERATION_PROMPT_ID

TOOLS_ID = "__tools__"
MiB = 1 << 20


def message_text(msg: ChatMessage) -> str:
    """The text a message contributes inside its chat-format wrapper."""
    parts = [msg.content] if msg.content else []
    parts.extend(format_tool_call(c) for c in msg.tool_calls)
    return "\n".join(parts)


def fingerprint(role: str, text: str) -> str:
    return hashlib.blake2b(f"{role}\x1f{text}".encode(), digest_size=8).hexdigest()


def tenant_scope(tenant: str) -> str:
    """The scope of everything a tenant's requests store (without `isolate`)."""
    return "tenant-" + digest("tenant", tenant)


@dataclass(frozen=True)
class MessagePlan:
    """How one prompt segment came from the request. `message_index` is None for segments the
    segmenter adds (tools block, prefill, generation prompt); `changed`: the previous request
    of the conversation (or group) had another message at this index."""

    segment_id: str
    message_index: int | None
    role: str
    kind: SegmentKind
    source: str  # system | tools | message | prefill | generation-prompt
    changed: bool = False


@dataclass(frozen=True)
class ChatPrompt:
    prompt: SegmentedPrompt
    plan: tuple[MessagePlan, ...]
    conversation: Conversation
    fingerprints: tuple[str, ...]  # one per request message
    history_scope: str  # the scope of its history segments (and of the reply)
    group: str | None = None  # its prompt_cache_key group (conversations.group_key)

    @property
    def conversation_id(self) -> str:
        """What the client echoes to continue the conversation."""
        return self.conversation.token


class ConversationTracker:
    """Segments requests and remembers, per conversation and `prompt_cache_key` group, the
    messages of its last request + reply (for `changed` labels). Thread-safe and bounded
    (conversations.py). `isolate`: history scoped to the conversation instead of the tenant.
    `secret` signs conversation tokens (default: a random one per tracker)."""

    def __init__(
        self,
        max_conversations: int = 4096,
        max_messages: int = 4096,
        isolate: bool = False,
        max_bytes: int = 64 * MiB,
        secret: bytes | None = None,
    ) -> None:
        self.isolate = isolate
        tokens = ConversationTokens(secret)
        self.book = ConversationBook(tokens, max_conversations, max_messages, max_bytes)

    def segment(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        conversation: str | None = None,
        prefill: str | None = None,
        tenant: str = "",
        cache_key: str | None = None,
    ) -> ChatPrompt:
        """`conversation`: the token the client echoed, if any; `tenant`: identity.tenant_id;
        `cache_key`: the request's prompt_cache_key (groups reports, never scopes reuse)."""
        if not messages:
            raise PromptError("messages must contain at least one message")
        texts = [message_text(m) for m in messages]
        fps = [fingerprint(m.chat_role, t) for m, t in zip(messages, texts, strict=True)]
        group = group_key(tenant, cache_key) if cache_key is not None else None
        conv, previous = self.book.resolve(conversation, tenant, group)
        history = conv.scope if self.isolate else tenant_scope(tenant)
        n_system = next(
            (i for i, m in enumerate(messages) if m.chat_role != "system"), len(messages)
        )
        build = _Builder(tenant, None if self.isolate else history)
        for i in range(n_system):
            changed = i < len(previous) and previous[i] != fps[i]
            build.static(texts[i], f"msg-{fps[i]}", messages[i].chat_role, i, changed)
        if tools:  # one system segment after the leading ones: the static prefix grows
            text = render_tools(tools)
            build.static(text, f"{TOOLS_ID}{fingerprint('system', text)}", "system", None, False)
        for i in range(n_system, len(messages)):
            changed = i < len(previous) and previous[i] != fps[i]
            seg = Segment(SegmentKind.FIXED, texts[i], build.unique(f"msg-{fps[i]}"),
                          messages[i].chat_role, history)  # fmt: skip
            build.add(seg, i, "message", changed)
        if prefill is not None:
            # the reply's opening with its first text: the generation prompt, so that the
            # reply is stored closed in its place (prompt/reply.py) as an unprefilled one is
            gen = Segment(SegmentKind.UPDATE, prefill, GENERATION_PROMPT_ID, "assistant", history)
            build.add(gen, None, "prefill")
        elif messages[-1].chat_role == "assistant":
            # a complete assistant message is closed; the reply opens a new one
            gen = Segment(SegmentKind.UPDATE, "", GENERATION_PROMPT_ID, "assistant", history)
            build.add(gen, None, "generation-prompt")
        return ChatPrompt(SegmentedPrompt(build.segments), tuple(build.plan), conv, tuple(fps),
                          history, group)  # fmt: skip

    def reply_segment(self, prompt: ChatPrompt, reply: ChatMessage) -> Segment:
        """The fixed segment `reply` becomes in the conversation's next request (the form its
        KV is stored under when it is generated)."""
        text = message_text(reply)
        sid = f"msg-{fingerprint(reply.chat_role, text)}"
        return Segment(SegmentKind.FIXED, text, sid, reply.chat_role, prompt.history_scope)

    def record(self, prompt: ChatPrompt, reply: ChatMessage | None) -> None:
        """After a turn: its request + reply is what its conversation and group sent last."""
        last = list(prompt.fingerprints)
        if reply is not None:
            last.append(fingerprint(reply.chat_role, message_text(reply)))
        self.book.record(prompt.conversation, last, prompt.group)


class _Builder:
    """The segments and plan of one request, in prompt order. `scope`: the static prefix's
    (None: each static segment scoped by everything before it)."""

    def __init__(self, tenant: str, scope: str | None) -> None:
        self.tenant, self.scope = tenant, scope
        self.segments: list[Segment] = []
        self.plan: list[MessagePlan] = []
        self._used: dict[str, int] = {}

    def add(self, seg: Segment, index: int | None, source: str, changed: bool = False) -> None:
        assert seg.id is not None and seg.role is not None
        self.segments.append(seg)
        self.plan.append(MessagePlan(seg.id, index, seg.role, seg.kind, source, changed))

    def unique(self, sid: str) -> str:
        """Repeated messages get distinct ids: msg-<fp>, msg-<fp>-2, ..."""
        self._used[sid] = self._used.get(sid, 0) + 1
        return sid if self._used[sid] == 1 else f"{sid}-{self._used[sid]}"

    def static(self, text: str, sid: str, role: str, index: int | None, changed: bool) -> None:
        scope = self.scope or prefix_scope(
            self.tenant, ((s.role or "", s.text) for s in self.segments)
        )
        source = "tools" if index is None else "system"
        seg = Segment(SegmentKind.SYSTEM, text, self.unique(sid), role, scope)
        self.add(seg, index, source, changed)
