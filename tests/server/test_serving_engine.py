"""The server over an engine that is not the embedded `Engine` (the seam `agentcache serve
--backend vllm` uses): only the `ServingEngine` protocol is touched, streaming goes through
`on_token`, request parameters reach the engine, and its reports reach the client."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import torch

from agentcache.backends import ServingEngine
from agentcache.kv.store import MissReason
from agentcache.model.tokenizer import ByteTokenizer, chat_format_for
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, tokenize_prompt
from agentcache.reuse.base import SegmentMiss
from agentcache.runtime.engine import Generation, GenerationParams, TurnStats
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread

REPLY = "Paris is the capital of France."


@dataclass
class ScriptedEngine:
    """Replies `REPLY` token by token; reports the first fixed segment as an evicted miss,
    reuses every other system/fixed token, and counts one fallback."""

    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer)
    max_context: int = 4096
    model_id: str = "scripted#0123"
    context_holder: str | None = None
    calls: list[tuple[GenerationParams, str | None, bool]] = field(default_factory=list)
    cancels: list[threading.Event | None] = field(default_factory=list)  # each call's `cancel`

    @property
    def config(self) -> Any:
        return type("Config", (), {"strategy": "rpdc"})()

    def strategy(self, name: str | None = None) -> str:
        return name or "rpdc"

    def tokenize(self, prompt: SegmentedPrompt) -> TokenizedPrompt:
        fmt = chat_format_for(self.tokenizer.vocab)
        return tokenize_prompt(prompt, self.tokenizer, fmt, self.max_context)

    def generate(
        self,
        prompt: SegmentedPrompt | TokenizedPrompt,
        params: GenerationParams | None = None,
        strategy: str | None = None,
        commit: bool = True,
        on_token: Callable[[int], None] | None = None,
        reply: Callable[[str], Segment | None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        params = params or GenerationParams()
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        self.calls.append((params, strategy, on_token is not None))
        self.cancels.append(cancel)
        ids = self.emit(params, on_token)
        fixed = [s for s in tokens.segments if s.kind == SegmentKind.FIXED]
        misses = tuple(
            SegmentMiss(s.segment.id, str(s.kind), len(s.ids), MissReason.EVICTED)
            for s in fixed[:1]
        )
        reused = sum(len(s.ids) for s in tokens.segments if s.kind != SegmentKind.UPDATE) - sum(
            m.num_tokens for m in misses
        )
        n = tokens.num_tokens
        stats = TurnStats(
            strategy="rpdc", prompt_tokens=n, reused_tokens=reused, recomputed_tokens=n - reused,
            recompute_fraction=(n - reused) / n, ttft_s=0.01, decode_tokens=len(ids),
            decode_tokens_per_s=100.0, fallbacks=1, fallback_reasons=("scripted fallback",),
            misses=misses,
        )  # fmt: skip
        finish = "length" if len(ids) == params.max_new_tokens else "stop"
        return Generation(self.tokenizer.decode(ids), ids, finish, torch.zeros(257), stats)

    def emit(
        self, params: GenerationParams, on_token: Callable[[int], None] | None
    ) -> tuple[int, ...]:
        """The reply's token ids, each passed to `on_token` as it is chosen."""
        ids = tuple(self.tokenizer.encode(REPLY)[: params.max_new_tokens])
        for token in ids:
            if on_token is not None:
                on_token(token)
        return ids

    def store_bytes(self) -> dict[str, int]:
        return {"folder": 4321}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


MESSAGES: list[Any] = [
    {"role": "system", "content": "You answer geography questions."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "Say it again, in a sentence."},
]


def test_the_server_only_needs_the_serving_protocol() -> None:
    engine = ScriptedEngine()
    seam: ServingEngine = engine  # mypy checks ScriptedEngine against the protocol
    app = create_app(seam, ServerConfig("scripted"))
    with serve_in_thread(app) as url:
        headers: dict[str, str] = {}
        for _ in range(2):  # the second time, the engine reports a hit and a miss
            raw = _client(url).chat.completions.with_raw_response.create(
                model="scripted", messages=MESSAGES, temperature=0.3, max_tokens=64,  # type: ignore[arg-type]
                stop=["never"], seed=7, extra_headers=headers,
            )  # fmt: skip
            headers = {"X-Agentcache-Conversation": raw.headers["x-agentcache-conversation"]}
            r = raw.parse()
        metrics = httpx.get(f"{url}/metrics").text
        models = httpx.get(f"{url}/v1/models").json()
    assert r.choices[0].message.content == REPLY
    params, strategy, streamed = engine.calls[-1]
    assert (params.max_new_tokens, params.temperature, params.stop, params.seed) == (
        64, 0.3, ("never",), 7,
    )  # fmt: skip
    assert strategy is None and streamed  # on_token: where a cancelled request stops
    # the turn's cancel event, each its own: where the engine stops a prefill it can stop
    cancels = engine.cancels
    assert len(cancels) == 2 and all(isinstance(c, threading.Event) for c in cancels)
    assert cancels[0] is not cancels[1]
    report = r.model_extra["agentcache"]  # type: ignore[index]
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == report["reused_tokens"] > 0
    statuses = {(s["role"], s["status"], s["reason"]) for s in report["segments"]}
    assert ("user", "evicted", "evicted") in statuses  # the engine's miss, by reason
    assert ("system", "hit", None) in statuses  # found; how, this engine does not say
    assert report["exact_tokens"] is None and report["computed_tokens"] is None
    assert report["fallbacks"] == 1 and report["fallback_reasons"] == ["scripted fallback"]
    # one per turn, both counted
    assert "agentcache_fallbacks_total 2.0" in metrics
    assert 'agentcache_store_bytes{tier="folder"} 4321.0' in metrics
    assert 'agentcache_cache_misses_total{reason="evicted"} 2.0' in metrics  # one per turn
    assert models["data"][0]["id"] == "scripted"


def test_streaming_goes_through_on_token_and_max_tokens_cuts_it() -> None:
    engine = ScriptedEngine()
    with serve_in_thread(create_app(engine, ServerConfig("scripted"))) as url:
        stream = _client(url).chat.completions.create(
            model="scripted", messages=MESSAGES, temperature=0, max_tokens=9, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(pieces) == REPLY[:9]
    assert len(pieces) > 1  # token by token, not one block
    assert engine.calls[-1][2]  # the engine got an on_token callback
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["length"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[0].completion_tokens == 9


def test_default_model_name_comes_from_the_engine() -> None:
    app = create_app(ScriptedEngine())
    with serve_in_thread(app) as url:
        models = httpx.get(f"{url}/v1/models").json()
    assert models["data"][0]["id"] == "scripted"
