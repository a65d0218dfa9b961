"""The engine: prompt in -> reuse strategy prefill -> decode over paged KV -> commit for reuse.

Requests are served one at a time under a lock, so several threads (sessions) may share one
engine and the store; each gets the outputs it would get alone.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import agentcache.reuse  # noqa: F401  (registers strategies)
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import DecodeStats
from agentcache.decode.dense import dense_step, reads_in_place, reference_step
from agentcache.decode.setup import DecodeSetup
from agentcache.errors import ConfigError, ContextLengthError, OutOfPagesError
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.kv.store import MemorySegmentStore, SegmentStore
from agentcache.model.loading import LoadedModel
from agentcache.model.tokenizer import TextTokenizer
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.tokenize import (
    GENERATION_PROMPT_ID,
    TokenizedPrompt,
    TokenizedSegment,
    render_segment,
    tokenize_prompt,
)
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.reuse.base import (
    STRATEGIES,
    PrefillResult,
    ReuseContext,
    ReuseStrategy,
    SegmentMiss,
)
from agentcache.reuse.segments import REUSABLE
from agentcache.runtime.sampling import sample
from agentcache.tiers.store import TierConfig, TieredSegmentStore
from agentcache.tiers.versions import adopt_recomputed

GiB = 1 << 30
SEEDS = (-(1 << 63), (1 << 64) - 1)  # the seeds torch.Generator.manual_seed takes


@dataclass(frozen=True)
class EngineConfig:
    strategy: str = DEFAULT_STRATEGY
    kv_pages: int = 2048  # fast-tier pages (16 tokens each) shared by running requests
    store_bytes: int = 4 * GiB  # segment store capacity
    eviction: str = "lru"
    page_size: int = 16
    strategy_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode policy (default dense)
    tiers: TierConfig | None = None  # None: one MemorySegmentStore of store_bytes

    def __post_init__(self) -> None:
        STRATEGIES.get(self.strategy)  # unknown names fail here, listing the known ones
        if self.kv_pages < 1:
            raise ConfigError("kv_pages must be >= 1")
        for name, options in self.strategy_options.items():  # here, not at the first request
            strategy = STRATEGIES.get(name)
            if not isinstance(options, Mapping):
                raise ConfigError(
                    f"strategy_options[{name!r}] must be a dict of options, "
                    f"got {type(options).__name__}"
                )
            try:
                strategy(**options)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"strategy_options[{name!r}]: {e}") from e


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"max_new_tokens must be an integer >= 0, got {n!r}")
        t = self.temperature
        if not isinstance(t, numbers.Real) or not (math.isfinite(t) and t >= 0.0):
            raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not isinstance(self.top_p, numbers.Real) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        seed = self.seed
        if seed is not None and not (
            isinstance(seed, numbers.Integral) and SEEDS[0] <= seed <= SEEDS[1]
        ):
            raise ConfigError(f"seed must be None or an integer in [-2**63, 2**64), got {seed!r}")
        stop = self.stop
        if isinstance(stop, str):  # one string is one stop string, as in OpenAI's API
            stop = (stop,)
        stop = tuple(stop) if isinstance(stop, Iterable) else (stop,)
        if not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)


@dataclass(frozen=True)
class TurnStats:
    strategy: str
    prompt_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    recompute_fraction: float
    ttft_s: float
    decode_tokens: int
    decode_tokens_per_s: float
    fallbacks: int
    fallback_reasons: tuple[str, ...]
    misses: tuple[SegmentMiss, ...]
    decode_policy: str = "dense"
    decode_fallbacks: int = 0  # 1 when the configured decode policy fell back to dense
    decode: DecodeStats | None = None  # sparse decode figures (None for dense)
    load_overlap: float | None = None  # share of the KV load hidden behind compute
    # the reply's KV stored under next turn's form of it: "stored", or why not (REPLY_KV)
    reply_kv: str | None = None
    probe_skipped: bool = False  # a probe strategy computed every candidate (ReuseStats)


# Engine.generate(reply=...) outcomes besides "stored"
REPLY_KV = {
    "no-reply": "the caller gave no segment for this reply",
    "sparse-decode": "a sparse decoder held the KV; the engine's pages were released",
    "no-generation-prompt": "the prompt did not end in the generation prompt (e.g. a prefill)",
    "retokenized": "the reply's message tokenizes differently from the generated tokens",
    "context": "the closed message would pass the model's positions",
    "backend": "this execution backend does not store replies (vLLM)",
    "no-room": "the fast tier had no page left for the message's closing tokens",
}


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length"
    first_token_logits: Tensor  # (V,)
    stats: TurnStats


class Engine:
    def __init__(
        self,
        model: LoadedModel,
        config: EngineConfig | None = None,
        store: SegmentStore | None = None,
    ) -> None:
        """`store` lets several engines share one segment store (entries stay per model)."""
        self.model = model
        self.config = config or EngineConfig()
        c = model.config
        pool_config = PoolConfig(
            c.num_layers, c.num_kv_heads, c.head_dim, self.config.kv_pages, self.config.page_size
        )
        self.ctx = ReuseContext(
            model,
            store or self._new_store(pool_config),
            PagePool(pool_config),
            self.config.tiers is not None and self.config.tiers.decoupled_load,
        )
        self._strategies: dict[str, ReuseStrategy] = {}
        self.decode = DecodeSetup.resolve(model, self.config.decode)
        self.gathered_steps = 0  # dense decode steps that copied the context (Engine.step)
        self._lock = threading.RLock()

    def _new_store(self, pool: PoolConfig) -> SegmentStore:
        tiers = self.config.tiers
        if tiers is None:
            return MemorySegmentStore(self.config.store_bytes, self.config.eviction)
        tiers.check_working_set(pool.page_bytes // pool.page_size, self.max_context)
        return TieredSegmentStore(tiers, self.config.eviction)

    @property
    def store(self) -> SegmentStore:
        return self.ctx.store

    # what the chat server reads (runtime.backends.ServingEngine); the vLLM backend has them too
    @property
    def tokenizer(self) -> TextTokenizer:
        return self.model.tokenizer

    @property
    def max_context(self) -> int:
        """Prompt + generated tokens, at most: the model's positions or, when smaller, the
        tokens the fast tier's KV pages hold (one request's pages must fit at once)."""
        return min(self.model.config.max_position_embeddings, self._pool_tokens)

    @property
    def context_holder(self) -> str | None:
        """What limits `max_context` when it is not the model's positions."""
        if self._pool_tokens >= self.model.config.max_position_embeddings:
            return None
        c = self.config
        return f"the engine's KV pool (kv_pages={c.kv_pages} of {c.page_size} tokens)"

    @property
    def _pool_tokens(self) -> int:  # set by the config, so known before the pool exists
        return self.config.kv_pages * self.config.page_size

    @property
    def model_id(self) -> str:
        return self.model.model_id

    def store_bytes(self) -> dict[str, int]:
        return {"memory": self.store.stats.bytes}

    def strategy(self, name: str | None = None) -> ReuseStrategy:
        name = name or self.config.strategy
        if name not in self._strategies:
            options = self.config.strategy_options.get(name, {})
            self._strategies[name] = STRATEGIES.get(name)(**options)
        return self._strategies[name]

    def tokenize(self, prompt: SegmentedPrompt) -> TokenizedPrompt:
        m = self.model
        return tokenize_prompt(prompt, m.tokenizer, m.chat_format, m.config.max_position_embeddings)

    def generate(
        self,
        prompt: SegmentedPrompt | TokenizedPrompt,
        params: GenerationParams | None = None,
        strategy: str | None = None,
        commit: bool = True,
        on_token: Callable[[int], None] | None = None,
        reply: Callable[[str], Segment | None] | None = None,
    ) -> Generation:
        """`on_token` is called with each new token id as it is chosen (for streaming).

        `reply` maps the reply's text to the segment it will be in the next turn's prompt (an
        assistant message); with `commit`, the KV of that closed message, computed here in its
        true context, is stored so the next turn finds it (TurnStats.reply_kv says whether)."""
        params = params or GenerationParams()
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        if tokens.num_tokens > self.max_context:  # before any page is taken or compute spent
            n, holder = tokens.num_tokens, self.context_holder
            raise ContextLengthError(n, self.max_context, "prompt", holder)
        with self._lock, torch.inference_mode():
            strat = self.strategy(strategy)
            seq = SequenceKV(self.ctx.pool)
            try:
                t0 = time.perf_counter()
                pre = strat.prefill(self.ctx, tokens, seq)
                ttft = time.perf_counter() - t0
                if commit:  # the prompt's KV, before a sparse decoder lets its pages go
                    self._commit(strat, tokens, seq, pre)
                ids, finish, decode_s, dstats = self._decode(seq, pre, params, on_token)
                text = self._text(ids, params.stop)
                reply_kv = None
                if commit and reply is not None:
                    reply_kv = self._commit_reply(strat, tokens, seq, pre, ids, reply(text))
            finally:
                seq.free()
        s = pre.stats
        stats = TurnStats(
            strat.name, s.prompt_tokens, s.reused_tokens, s.recomputed_tokens,
            s.recompute_fraction, ttft, len(ids), len(ids) / decode_s if decode_s > 0 else 0.0,
            s.fallbacks, tuple(s.fallback_reasons), tuple(s.misses), self.decode.policy,
            int(self.decode.fallback_reason is not None), dstats, s.load_overlap, reply_kv,
            s.probe_skipped,
        )  # fmt: skip
        return Generation(text, tuple(ids), finish, pre.logits, stats)

    def _commit_reply(
        self,
        strat: ReuseStrategy,
        prompt: TokenizedPrompt,
        seq: SequenceKV,
        pre: PrefillResult,
        ids: list[int],
        segment: Segment | None,
    ) -> str:
        """Store the prompt with the reply as the closed message that replaces the generation
        prompt next turn: its KV is the generation prompt's (already in `seq`), the generated
        tokens' and the few closing tokens, computed here."""
        if segment is None:
            return "no-reply"
        if seq.num_tokens == 0:
            return "sparse-decode"
        head = prompt.segments[-1]
        if head.segment.id != GENERATION_PROMPT_ID:
            return "no-generation-prompt"
        m = self.model
        closed = tuple(m.tokenizer.encode(render_segment(segment, m.chat_format, is_last=False)))
        n = prompt.num_tokens
        body = prompt.ids[head.start :] + tuple(ids)
        if closed[: len(body)] != body:
            return "retokenized"
        start = int(pre.positions.max().item()) + 1  # the first generated token's position
        extra = len(closed) - len(head.ids)  # tokens after the prompt
        if start + extra > m.config.max_position_embeddings:
            return "context"
        try:
            for i in range(seq.num_tokens - n, extra):  # not fed: the last token, the closing
                self.step(seq, closed[len(head.ids) + i], start + i)
        except OutOfPagesError:
            return "no-room"
        segs = (*prompt.segments[:-1], TokenizedSegment(segment, closed, head.start))
        full = TokenizedPrompt(segs, prompt.ids[: head.start] + closed)
        positions = torch.cat([pre.positions, torch.arange(start, start + extra)])
        strat.commit(self.ctx, full, seq, positions)
        return "stored"

    def commit_reply(
        self, prompt: TokenizedPrompt, seq: SequenceKV, pre: PrefillResult,
        reply_ids: Sequence[int], segment: Segment, strategy: str | None = None,
    ) -> str:  # fmt: skip
        """Store the prompt with a given reply, as `generate(reply=...)` stores a generated one:
        `reply_ids` are the tokens after the prompt (the reply's, then the message's closing
        ones), `seq` holds the prompt's KV only (after `prefill`). Returns "stored" or why not
        (REPLY_KV)."""
        with self._lock, torch.inference_mode():
            strat = self.strategy(strategy)
            return self._commit_reply(strat, prompt, seq, pre, list(reply_ids), segment)

    def _adopts(self) -> bool:
        return self.config.tiers is not None and self.config.tiers.adopt_recomputed

    def commit(
        self, prompt: TokenizedPrompt, seq: SequenceKV, pre: PrefillResult,
        strategy: str | None = None,
    ) -> None:  # fmt: skip
        """Store the prompt's KV from `seq` after `prefill`, as `generate` does: the strategy's
        segments, then (tiered store with `adopt_recomputed`) the recomputed tokens' newer
        K/V of reused segments as dirty pages."""
        with self._lock, torch.inference_mode():
            self._commit(self.strategy(strategy), prompt, seq, pre)

    def _commit(
        self, strat: ReuseStrategy, prompt: TokenizedPrompt, seq: SequenceKV, pre: PrefillResult
    ) -> None:
        strat.commit(self.ctx, prompt, seq, pre.positions)
        if pre.stats.dirty is not None and self._adopts():
            reused = [s for s in prompt.segments if s.kind in REUSABLE]
            adopt_recomputed(
                self.store, self.ctx.model, reused, seq, pre.positions, pre.stats.dirty
            )

    def prefill(
        self, prompt: TokenizedPrompt, strategy: str | None = None
    ) -> tuple[SequenceKV, PrefillResult]:
        """Prefill only; the caller owns the returned sequence and must `free()` it."""
        with self._lock, torch.inference_mode():
            seq = SequenceKV(self.ctx.pool)
            try:
                return seq, self.strategy(strategy).prefill(self.ctx, prompt, seq)
            except BaseException:
                seq.free()
                raise

    def step(self, seq: SequenceKV, token: int, position: int) -> Tensor:
        """Append one token at `position` and return the logits after it (V,).

        The context is read in place from the page pool (`decode.dense`); a forward with its own
        attention (`attend` overridden) reads a gathered copy, counted in `gathered_steps`."""
        f = self.model.forward
        with self._lock, torch.inference_mode():
            if reads_in_place(f):
                return dense_step(f, seq, token, position)
            self.gathered_steps += 1
            return reference_step(f, seq, token, position)

    def _decode(
        self,
        seq: SequenceKV,
        pre: PrefillResult,
        params: GenerationParams,
        on_token: Callable[[int], None] | None = None,
    ) -> tuple[list[int], str, float, DecodeStats | None]:
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        max_pos = self.model.config.max_position_embeddings
        position = int(pre.positions.max().item()) + 1
        if position >= max_pos and params.max_new_tokens > 0:
            raise ContextLengthError(position + 1, max_pos, "prompt + 1 new token")
        eos = self.model.tokenizer.eos_token_ids
        ids: list[int] = []
        logits = pre.logits
        t0 = time.perf_counter()
        sparse = (  # built only if a step will run
            self.decode.decoder(self.model, seq, seq.num_tokens + params.max_new_tokens)
            if params.max_new_tokens > 1
            else None
        )
        if sparse is not None:
            seq.free()  # the decoder holds its own copy: the fast tier keeps only its arena
        draft = 0  # > 0: greedy self-speculative decoding (DecodeConfig.verify)
        if sparse is not None and sparse.config.verify:
            if params.temperature > 0:
                sparse.verify_skipped = True
            else:
                draft = sparse.config.verify
        queue: list[int] = []  # verified tokens not emitted yet
        finish = "length"
        while len(ids) < params.max_new_tokens and position < max_pos:
            token = queue.pop(0) if queue else sample(logits, params.temperature, params.top_p, gen)
            if token in eos:
                finish = "stop"
                break
            ids.append(token)
            if on_token is not None:
                on_token(token)
            if params.stop and self._hits_stop(ids, params.stop):
                finish = "stop"
                break
            if len(ids) == params.max_new_tokens:
                break
            if draft and sparse is not None:
                if not queue:
                    room = min(draft, params.max_new_tokens - len(ids), max_pos - position - 1)
                    queue = sparse.advance(token, position, max(room, 1), eos)
            elif sparse is not None:
                logits = sparse.step(token, position)
            elif seq.num_tokens < self._pool_tokens:
                logits = self.step(seq, token, position)
            else:  # the fast tier holds no more of this sequence: as at the last position
                break
            position += 1
        elapsed = time.perf_counter() - t0
        return ids, finish, elapsed, sparse.stats() if sparse else None

    def _hits_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        text = self.model.tokenizer.decode(ids)
        return any(s in text for s in stop)

    def _text(self, ids: list[int], stop: tuple[str, ...]) -> str:
        text = self.model.tokenizer.decode(ids)
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        return text if cut < 0 else text[:cut]
