"""Execution backends behind one session surface: the embedded engine or vLLM.

`create_engine("embedded")` is agentcache's own `Engine`; `create_engine("vllm")` is vLLM with
agentcache's KV connector (`agentcache.engines.vllm`, imported only then). Both give
`config.strategy`, `strategy(name)`, `tokenize(prompt)` and `generate(prompt, params,
strategy, on_token=...)`, so `AgentSession` and the agent code above it run unchanged on either.
`ServingEngine` adds what the chat server needs (the tokenizer, the context length, the model
id, the store's size), so `agentcache serve` runs on either too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agentcache.errors import ConfigError
from agentcache.model.tokenizer import TextTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.runtime.engine import Generation, GenerationParams

BACKENDS = ("embedded", "vllm")


class TurnEngine(Protocol):
    """What a session needs from an execution engine."""

    @property
    def config(self) -> Any: ...  # has `.strategy`, the default strategy name

    def strategy(self, name: str | None = None) -> object: ...

    def tokenize(self, prompt: SegmentedPrompt) -> TokenizedPrompt: ...

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
        """One turn; `reply`: see `Engine.generate`.

        `cancel` is the caller's stop signal (its client left, its deadline passed). The
        engine looks at it at these points, and once it finds it set the turn raises
        `TurnCancelled` (`agentcache.runtime.engine`), its pages freed, nothing more
        committed: the embedded engine before the prefill starts and before each chunk of a
        prefill run in chunks (`EngineConfig.prefill_chunk_tokens`); the vLLM backend before
        the request is added and before each of vLLM's engine steps (the request aborted).
        Work between two looks finishes first (a prefill run whole, one engine step).
        Decoding stops when `on_token` raises: that is how a caller stops it at the next
        token (the embedded engine does not look at `cancel` while decoding)."""
        ...


class ServingEngine(TurnEngine, Protocol):
    """What the chat server (`agentcache serve`, `ChatEngine`) needs from an engine."""

    @property
    def tokenizer(self) -> TextTokenizer: ...  # decodes streamed token ids

    @property
    def max_context(self) -> int: ...  # prompt + generated tokens, at most

    @property
    def context_holder(self) -> str | None: ...  # what sets max_context; None: the model

    @property
    def model_id(self) -> str: ...  # `name#weights-fingerprint`

    def store_bytes(self) -> dict[str, int]: ...  # bytes held by the segment store, per tier


def create_engine(
    backend: str = "embedded",
    model: str | None = None,
    strategy: str = DEFAULT_STRATEGY,
    cache_dir: Path | None = None,
    **options: Any,
) -> TurnEngine:
    """An engine of `backend`; `options` go to `EngineConfig` or `VLLMConfig`."""
    if backend == "embedded":
        from agentcache.model.loading import load_model
        from agentcache.runtime.engine import Engine, EngineConfig

        return Engine(load_model(model, cache_dir), EngineConfig(strategy=strategy, **options))
    if backend == "vllm":
        from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig

        folder = None if model is None else str(model)  # a Path too, as load_model takes it
        return VLLMBackend(VLLMConfig(model=folder, strategy=strategy, **options), cache_dir)
    raise ConfigError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
