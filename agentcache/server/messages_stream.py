"""The Messages API stream:

    message_start (usage: the prompt's tokens so far) , ping
    text:      content_block_start {text ""} , content_block_delta text_delta ... ,
               content_block_stop                    (opened at the first piece)
    each call: content_block_start {tool_use, input {}} , content_block_delta input_json_delta ,
               content_block_stop
    message_delta {stop_reason, stop_sequence; usage: the final split} , message_stop

The pieces of text leave out the prefill the client wrote (the reply continues it), so they
add up to the text block of the non-streamed reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from agentcache.chat.runner import ChatResult
from agentcache.server.errors import APIError
from agentcache.server.messages_api import (
    MessagesTurn,
    extension,
    reply_text,
    stop_reason,
    stop_sequence,
    tool_use_block,
    usage,
)


def event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


class MessagesEmitter:
    """One reply's Messages events (the `Emitter` of turns.py). `on_result` runs before the
    last events."""

    def __init__(self, model: str, mid: str, turn: MessagesTurn, prompt_tokens: int,
                 on_result: Callable[[ChatResult], None] | None = None) -> None:  # fmt: skip
        self.model, self.mid, self.turn, self.prompt_tokens = model, mid, turn, prompt_tokens
        self.on_result = on_result
        self.skip = len(turn.prefill)  # characters of prefill still to leave out
        self.shown = ""
        self.opened = False

    def start(self) -> Iterator[str]:
        message: dict[str, Any] = {
            "id": self.mid, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        }  # fmt: skip
        yield event("message_start", {"message": message})
        yield event("ping", {})

    def _open(self) -> Iterator[str]:
        if not self.opened:
            self.opened = True
            block = {"type": "text", "text": ""}
            yield event("content_block_start", {"index": 0, "content_block": block})

    def text(self, piece: str) -> Iterator[str]:
        cut = min(self.skip, len(piece))
        piece, self.skip = piece[cut:], self.skip - cut
        if not piece:
            return
        yield from self._open()
        self.shown += piece
        yield event("content_block_delta",
                    {"index": 0, "delta": {"type": "text_delta", "text": piece}})  # fmt: skip

    def finish(self, result: ChatResult) -> Iterator[str]:
        text = reply_text(result, self.turn.prefill)
        index = 0
        if text or not result.tool_calls:
            yield from self._open()
            if text.startswith(self.shown) and len(text) > len(self.shown):
                yield from self.text(text[len(self.shown) :])
            yield event("content_block_stop", {"index": 0})
            index = 1
        for i, call in enumerate(result.tool_calls, start=index):
            start = {"index": i, "content_block": tool_use_block(call, with_input=False)}
            yield event("content_block_start", start)
            json_delta = {"type": "input_json_delta", "partial_json": call.arguments_json()}
            yield event("content_block_delta", {"index": i, "delta": json_delta})
            yield event("content_block_stop", {"index": i})
        if self.on_result is not None:
            self.on_result(result)
        delta = {"stop_reason": stop_reason(result, self.turn),
                 "stop_sequence": stop_sequence(result, self.turn)}  # fmt: skip
        yield event(
            "message_delta",
            {
                "delta": delta,
                "usage": usage(result, self.turn.retention),
                "agentcache": extension(result, self.turn.retention),
            },
        )
        yield event("message_stop", {})

    def error(self, err: APIError) -> str:
        return event("error", {"error": err.body("/v1/messages")["error"]})
