"""Chat sessions in workload files: each turn is the request an OpenAI client would send.

    {"name": "chat-00", "workload": "chat", "split": "validate", "turns": [
      {"messages": [{"role": "system", ...}, {"role": "user", ...}], "tools": [...]},
      {"messages": [..., {"role": "assistant", ...}, {"role": "user", ...}], "tools": [...]}]}

The server's own segmenter (`chat.segmenter.ConversationTracker`, one per session) turns each
turn's messages into segments, and records the turn as the server does after replying: the
reply is the assistant message that the next turn's list holds right after this turn's
messages (what the client sent back), stored as the server stores it. A turn whose next request
is not its continuation (a retry drops the reply, a subagent's request comes in between) names
its reply in `"reply"` (an assistant message, or null for none). The bench measures the
segments `agentcache serve` and the LangChain model would build for the same requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.segmenter import ConversationTracker
from agentcache.errors import PromptError
from agentcache.prompt.segments import Segment, SegmentedPrompt

T = TypeVar("T")
Request = tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...]]


def is_chat(turns: Sequence[Any]) -> bool:
    """Whether a session's turns are message lists; mixing them with segments is an error."""
    kinds = {isinstance(t, dict) and "messages" in t for t in turns}
    if len(kinds) > 1:
        raise PromptError("a session's turns are all 'messages' lists or none is")
    return kinds == {True}


def chat_turns(turns: Sequence[Any]) -> list[tuple[SegmentedPrompt, Segment | None]]:
    """Each turn's prompt and the segment its reply becomes next turn (None: no reply)."""
    requests = [_request(t, i) for i, t in enumerate(turns)]
    tracker = ConversationTracker()
    out: list[tuple[SegmentedPrompt, Segment | None]] = []
    for i, (messages, tools) in enumerate(requests):
        try:
            chat = tracker.segment(messages, tools)
        except PromptError as e:
            raise PromptError(f"turn {i}: {e}") from e
        following = requests[i + 1][0] if i + 1 < len(requests) else ()
        reply = _given_reply(turns[i], i) if "reply" in turns[i] else _reply(messages, following)
        tracker.record(chat, reply)
        out.append((chat.prompt, tracker.reply_segment(chat, reply) if reply else None))
    return out


def _reply(messages: Sequence[ChatMessage], following: Sequence[ChatMessage]) -> ChatMessage | None:
    """The assistant message the next request holds right after this request's messages."""
    if len(following) > len(messages) and following[len(messages)].role == "assistant":
        return following[len(messages)]
    return None


def _given_reply(turn: dict[str, Any], index: int) -> ChatMessage | None:
    raw = turn["reply"]
    if raw is None:
        return None
    try:
        (reply,) = _items([raw], "reply", ChatMessage.from_openai)
    except PromptError as e:
        raise PromptError(f"turn {index}: {e}") from e
    if reply.role != "assistant":
        raise PromptError(f"turn {index}: 'reply' must be an assistant message, got {reply.role!r}")
    return reply


def _request(turn: Any, index: int) -> Request:
    try:
        messages = _items(turn.get("messages"), "messages", ChatMessage.from_openai)
        tools = _items(turn.get("tools", []), "tools", ToolSpec.from_openai)
    except PromptError as e:
        raise PromptError(f"turn {index}: {e}") from e
    if not messages:
        raise PromptError(f"turn {index}: 'messages' must not be empty")
    if messages[-1].role == "assistant":
        raise PromptError(
            f"turn {index}: the last message is the assistant's; a turn ends where the model "
            "must answer (after a user or tool message)"
        )
    return messages, tools


def _items(raw: Any, what: str, parse: Callable[[Mapping[str, Any]], T]) -> tuple[T, ...]:
    if not isinstance(raw, list):
        raise PromptError(f"'{what}' must be a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise PromptError(f"{what}[{i}] must be an object, got {type(item).__name__}")
        try:
            out.append(parse(item))
        except PromptError as e:
            raise PromptError(f"{what}[{i}]: {e}") from e
        except (TypeError, ValueError, AttributeError) as e:  # a field of the wrong shape
            raise PromptError(f"{what}[{i}] is malformed ({e})") from e
    return tuple(out)
