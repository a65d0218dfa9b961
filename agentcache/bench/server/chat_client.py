"""One streamed chat completion, timed by the client: what an agent's turn costs as it sees it.

The request asks for usage in the stream (`stream_options.include_usage`), which
`agentcache serve` and `vllm serve` both send as a last chunk. The time to first token is the
time from sending the request to the first chunk that carries reply text or a tool call (a
server may open the stream with an empty role chunk before its prefill; a reply with neither
is timed to its finish chunk). The server's own prefill time is read from the finish chunk's
`agentcache` report where there is one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

CONVERSATION_HEADER = "X-Agentcache-Conversation"


class TurnError(Exception):
    """A request the server refused, or a stream that ended in an error event."""


@dataclass(frozen=True)
class TurnResult:
    """A reply as compared (`reply`: its text and tool calls, see `reply_key`) and its costs:
    client-measured seconds to the first token and to the end, the server's prefill seconds
    (None where the server does not report it) and the usage it reported (None where absent)."""

    reply: str
    finish_reason: str | None
    ttft_s: float
    latency_s: float
    server_ttft_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    conversation: str | None  # agentcache's conversation token, echoed on the next turn


def reply_key(content: str, calls: list[tuple[str, str]]) -> str:
    """The reply as compared between runs: its text and its tool calls' names and arguments."""
    return json.dumps([content, calls])


def stream_turn(
    http: httpx.Client,
    model: str,
    request: dict[str, Any],
    max_tokens: int,
    conversation: str | None = None,
    salt: str | None = None,
) -> TurnResult:
    """POST `request` (`messages`, optional `tools`) to /v1/chat/completions, greedy and
    streamed, with `cache_salt` `salt` when given (the tenant, to agentcache and to vLLM);
    read the stream to its end. Raises TurnError (or httpx's errors)."""
    body: dict[str, Any] = {"model": model, "messages": request["messages"],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}  # fmt: skip
    if request.get("tools"):
        body["tools"] = request["tools"]
    if salt is not None:
        body["cache_salt"] = salt
    headers = {CONVERSATION_HEADER: conversation} if conversation else {}
    t0 = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            raise TurnError(f"status {r.status_code}: {r.text[:300]}")
        reader = _StreamReader(t0)
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                reader.event(json.loads(line[6:]))
        token = r.headers.get(CONVERSATION_HEADER.lower())
    return reader.result(time.perf_counter() - t0, token)


class _StreamReader:
    """Folds a stream's chunks into the reply, its first-token time and its usage."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.first_s: float | None = None
        self.pieces: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.report: dict[str, Any] = {}

    def event(self, e: dict[str, Any]) -> None:
        if "error" in e:
            raise TurnError(f"stream error: {e['error'].get('message', e['error'])}")
        for choice in e.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self._first()
                self.pieces.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                self._first()
                name_args = self.calls.setdefault(call.get("index", len(self.calls)), ["", ""])
                fn = call.get("function") or {}
                name_args[0] += fn.get("name") or ""
                name_args[1] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self._first()
                self.finish = choice["finish_reason"]
        if e.get("usage"):
            self.usage = e["usage"]
        if isinstance(e.get("agentcache"), dict):
            self.report = e["agentcache"]

    def _first(self) -> None:
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.t0

    def result(self, latency_s: float, token: str | None) -> TurnResult:
        calls = [(n, a) for _, (n, a) in sorted(self.calls.items())]
        details = self.usage.get("prompt_tokens_details") or {}
        server_ttft = self.report.get("ttft_s")
        return TurnResult(
            reply_key("".join(self.pieces), calls), self.finish,
            latency_s if self.first_s is None else self.first_s, latency_s,
            None if server_ttft is None else float(server_ttft),
            self.usage.get("prompt_tokens"), self.usage.get("completion_tokens"),
            details.get("cached_tokens"), token,
        )  # fmt: skip
