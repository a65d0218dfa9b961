"""The engine: prompt in -> reuse strategy prefill -> decode over paged KV -> commit for reuse.

Several threads (sessions, the server's requests) may share one engine and its store, each
unit of work under the engine's lock, taken in arrival order but for prefills waiting
together, which go fewest tokens to compute first (`runtime/sharing.py`). With
`EngineConfig.batch_decode`, the running turns decode as one batch per step
(`runtime/scheduler.py`); without, their decode steps interleave token by token. Either way
each turn gets the outputs it would get alone, and a short request is not held behind a long
one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor

import agentcache.reuse  # noqa: F401  (registers strategies)
from agentcache.decode.base import Decoder
from agentcache.decode.dense import DenseDecoder, dense_step, reads_in_place, reference_step
from agentcache.decode.setup import DecodeSetup
from agentcache.decode.stats import DecodeStats
from agentcache.errors import ConfigError, ContextLengthError, OutOfPagesError, PromptError
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.kv.preemption import PREEMPTION_POLICIES, PreemptionPolicy, Swap
from agentcache.kv.shared import SharedPages
from agentcache.kv.store import SegmentStore, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.model.tokenizer import TextTokenizer
from agentcache.prompt.reply import close_reply
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt, tokenize_prompt
from agentcache.reuse.base import STRATEGIES, PrefillResult, ReuseContext, ReuseStrategy
from agentcache.reuse.prefix import block_chain, chain_scope
from agentcache.reuse.segments import REUSABLE
from agentcache.runtime import chunked
from agentcache.runtime.config import EngineConfig
from agentcache.runtime.loop import TurnDecoding, decode_loop
from agentcache.runtime.params import GenerationParams, turn_params
from agentcache.runtime.scheduler import BatchScheduler, TurnCancelled
from agentcache.runtime.sharing import FairLock, PageGate
from agentcache.runtime.stats import DecodePart, Generation, PrefillPart, ReplyKV, TurnStats
from agentcache.runtime.stops import cut_at_stop
from agentcache.tiers.store import TieredSegmentStore
from agentcache.tiers.versions import adopt_recomputed
from agentcache.units import machine_memory_bytes

# the turn's types, imported from here by the session, the server and the vLLM backend
__all__ = ["Engine", "EngineConfig", "Generation", "GenerationParams", "PoolCapacityError",
           "ReplyKV", "TurnCancelled", "TurnStats"]  # fmt: skip

REPLY_CLOSING = 16  # tokens a turn's pages allow for after its reply (the message's closing)


class PoolCapacityError(ContextLengthError):
    """A request whose prompt and new tokens can never fit the engine's KV pool at once,
    raised before it waits for pages, under preemption (a context-length error: the server
    answers 400, as it does from its own check of prompt + max_tokens)."""


class LockedDecoder(Decoder):
    """`inner` with each `feed` under the engine's lock: one decode step is one unit of work."""

    def __init__(self, inner: Decoder, lock: FairLock) -> None:
        self.inner, self.lock = inner, lock

    def feed(self, token: int, position: int, room: int) -> Tensor | int | None:
        with self.lock, torch.inference_mode():
            return self.inner.feed(token, position, room)

    def stats(self) -> DecodeStats | None:
        return self.inner.stats()


class Engine:
    def __init__(
        self,
        model: LoadedModel,
        config: EngineConfig | None = None,
        store: SegmentStore | None = None,
    ) -> None:
        """`store` lets several engines share one segment store (entries stay per model)."""
        if not isinstance(model, LoadedModel):
            raise ConfigError(
                f"Engine needs a loaded model (agentcache.load_model(folder or None)), got "
                f"{type(model).__name__} {model!r:.60}"
            )
        if config is not None and not isinstance(config, EngineConfig):
            raise ConfigError(
                f"config must be an EngineConfig, got {type(config).__name__} "
                "(EngineConfig(**options) makes one from a dict)"
            )
        self.model = model
        self.config = config or EngineConfig()
        pool_config = self.pool_config
        self._check_pool_fits(pool_config)  # once: `pool_config` is read on every request
        self.ctx = ReuseContext(
            model,
            store or self._new_store(pool_config),
            PagePool(pool_config),
            self.config.tiers is not None and self.config.tiers.decoupled_load,
            self.config.cost_guard,
        )
        self._strategies: dict[str, ReuseStrategy] = {}
        model.forward.require_strategy(self.config.strategy)  # the model family's limits
        self.decode = DecodeSetup.resolve(model, self.config.decode)
        self.gathered_steps = 0  # dense decode steps that copied the context (Engine.step)
        burst = self.config.prefill_burst_tokens if self.config.batch_decode else 0
        self._lock = FairLock(self.config.prefill_order == "shortest", burst_tokens=burst)
        self.gate = PageGate(self.ctx.pool, self._lock)
        # running turns' full prompt pages, for the next turn with the same opening to share
        self.shared: SharedPages | None = None
        if self.config.share_pages:
            self.shared = SharedPages(self.ctx.pool)
        self.batch: BatchScheduler | None = None
        if self.config.batch_decode:
            policy = self._preemption_policy()
            chunk = self.config.prefill_chunk_tokens or 0
            self.batch = BatchScheduler(model.forward, self._lock, policy, self.gate.wake, chunk)
            if policy is not None:
                batch = self.batch
                self.gate.hold = lambda: batch.waiting_preempted > 0

    def _preemption_policy(self) -> PreemptionPolicy | None:
        name = self.config.preemption
        if name is None:
            return None
        if name == "swap":
            return Swap(self.config.preemption_host_bytes)
        return PREEMPTION_POLICIES.get(name)()

    def _new_store(self, pool: PoolConfig) -> SegmentStore:
        tiers = self.config.tiers
        if tiers is None:
            return MemorySegmentStore(self.config.store_bytes, self.config.eviction)
        tiers.check_working_set(pool.page_bytes // pool.page_size, self.max_context)
        return TieredSegmentStore(tiers, self.config.eviction)

    @property
    def pool_config(self) -> PoolConfig:
        """The fast tier's pool: `kv_bytes` of pages when set, else `kv_pages` pages."""
        c, e = self.model.config, self.config
        if e.kv_bytes is None:
            return PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, e.kv_pages, e.page_size)
        try:
            return PoolConfig.from_bytes(
                c.num_layers, c.num_kv_heads, c.head_dim, e.kv_bytes, e.page_size
            )
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def _check_pool_fits(self, pool: PoolConfig) -> None:
        """`ConfigError` when the pool's K/V could outgrow this machine's memory (its pages are
        taken lazily, so a larger pool would start, and end in the OOM killer once filled)."""
        memory, e = machine_memory_bytes(), self.config
        if memory is not None and pool.pool_bytes > memory:
            which = f"kv_bytes={e.kv_bytes}" if e.kv_bytes is not None else f"kv_pages={e.kv_pages}"
            raise ConfigError(f"the engine's KV pool ({which}: {pool.pool_bytes} bytes) exceeds "
                              f"this machine's memory ({memory} bytes); give it less")  # fmt: skip

    @property
    def store(self) -> SegmentStore:
        return self.ctx.store

    # what the chat server reads (agentcache.backends.ServingEngine); the vLLM backend has them too
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
        if c.kv_bytes is not None:
            pool = self.pool_config
            return (f"the engine's KV pool (kv_bytes={c.kv_bytes}: {pool.num_pages} pages of "
                    f"{c.page_size} tokens, {pool.page_bytes} bytes each)")  # fmt: skip
        return f"the engine's KV pool (kv_pages={c.kv_pages} of {c.page_size} tokens)"

    @property
    def _pool_tokens(self) -> int:  # set by the config, so known before the pool exists
        return self.pool_config.num_pages * self.config.page_size

    @property
    def model_id(self) -> str:
        return self.model.model_id

    def store_bytes(self) -> dict[str, int]:
        return {"memory": self.store.stats.bytes}

    def strategy(self, name: str | None = None) -> ReuseStrategy:
        name = name or self.config.strategy
        if name not in self._strategies:
            self.model.forward.require_strategy(name)
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
        cancel: threading.Event | None = None,
    ) -> Generation:
        """`on_token` is called with each new token id as it is chosen (for streaming).

        `cancel`, once set, stops the turn before its prefill starts and a prefill that runs
        in chunks (`EngineConfig.prefill_chunk_tokens`) before its next chunk, raising
        `TurnCancelled`; its pages are freed, nothing is committed. (Decode stops when
        `on_token` raises.)

        `reply` maps the reply's text to the segment it will be in the next turn's prompt (an
        assistant message); with `commit`, the KV of that closed message, computed here in its
        true context, is stored so the next turn finds it (TurnStats.reply_kv says whether)."""
        params = turn_params(params, reply)
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        if tokens.num_tokens > self.max_context:  # before any page is taken or compute spent
            n, holder = tokens.num_tokens, self.context_holder
            raise ContextLengthError(n, self.max_context, "prompt", holder)
        self._check_fits(tokens, params)
        with self.gate.admit(self._pages_for(tokens, params)) as seq:
            strat, pre, ttft = self._prefill_commit(strategy, tokens, seq, commit, cancel)
            shared = 0

            def share() -> None:  # before its decoder is made (batched: its first token out)
                nonlocal shared
                shared = self._share(tokens, seq)

            def refill(empty: SequenceKV) -> None:  # a preempted turn's prompt, recomputed
                work = self._chunked(strat, tokens, empty)  # as it first ran: the same bits
                if isinstance(work, chunked.ChunkedPrefill):
                    work.run_all()

            ids, finish, decode = self._decode(seq, pre, params, on_token, refill, share)
            text = cut_at_stop(self.model.tokenizer.decode(ids), params.stop)
            reply_kv = None
            if commit and reply is not None:
                segment = reply(text)
                if segment is not None and not isinstance(segment, Segment):
                    raise PromptError(
                        f"reply(text) must return the reply's Segment or None, got "
                        f"{type(segment).__name__}; the turn's text: {text[:200]!r}"
                    )
                with self._turn_lock(), torch.inference_mode():
                    reply_kv = self._commit_reply(strat, tokens, seq, pre, ids, segment)
        prefill = PrefillPart.of(strat.name, pre.stats, ttft)
        stats = TurnStats.of(prefill=prefill, decode=decode, reply_kv=reply_kv,
                             shared_pages=shared)  # fmt: skip
        return Generation(text, tuple(ids), finish, pre.logits, stats)

    def _share(self, tokens: TokenizedPrompt, seq: SequenceKV) -> int:
        """After the turn's prefill, its full prompt pages whose K/V a running turn holds too
        (the same opening, the same bits) become that turn's pages, its own given back to the
        pool (`kv/shared.py`); its other full pages are offered to later turns. The pages are
        compared outside the engine's lock, beside the other turns' steps. Returns the pages
        shared."""
        registry = self.shared
        if registry is None or seq.num_tokens < self.config.page_size:
            return 0
        chain = block_chain(tokens.ids, self.config.page_size, chain_scope(tokens))
        with self._turn_lock(), torch.inference_mode():
            found = registry.candidates(seq, chain)
            if not found:  # nothing to compare: its pages offered to later turns
                return registry.settle(seq, chain, found, [])
        equal = [False] * len(found)  # the pins are dropped whatever happens
        try:
            with torch.inference_mode():  # outside the lock: the pages compared are pinned
                equal = registry.equal(seq, found)
        finally:
            with self._turn_lock(), torch.inference_mode():
                shared = registry.settle(seq, chain, found, equal)
        if shared:
            self.gate.wake()  # pages given back: a waiting turn may fit now
        return shared

    def _turn_lock(self) -> AbstractContextManager[object]:
        """The engine's lock for a running turn's short work between its prefill and its
        end (its decoder's adoption, its reply's commit): with batching, taken ahead of the
        waiting prefills once in turn (`sharing.FairLock.first`), so the turn does not wait
        behind the prefills that queued meanwhile."""
        return self._lock.first() if self.batch is not None else self._lock

    def _prefill_commit(
        self, strategy: str | None, tokens: TokenizedPrompt, seq: SequenceKV, commit: bool,
        cancel: threading.Event | None,
    ) -> tuple[ReuseStrategy, PrefillResult, float]:  # fmt: skip
        """The turn's prefill and (with `commit`) the prompt's commit, under the engine's lock;
        a prefill the scheduler runs in chunks (`_chunked`) runs in its steps, beside the
        decoding turns. Returns the strategy, the prefill and its time to the first token."""
        with self._lock.prefill(self._prefill_cost(tokens)), torch.inference_mode():
            if cancel is not None and cancel.is_set():  # left while waiting for pages or lock
                raise TurnCancelled("cancelled before its prefill started")
            strat = self.strategy(strategy)
            t0 = time.perf_counter()
            work = self._chunked(strat, tokens, seq)
            if isinstance(work, PrefillResult):  # run whole
                pre = work
                ttft = time.perf_counter() - t0
                if commit:  # the prompt's KV, before a sparse decoder lets its pages go
                    self._commit(strat, tokens, seq, pre)
                return strat, pre, ttft
        assert self.batch is not None
        pre = self.batch.prefill(work, cancel)
        ttft = time.perf_counter() - t0
        if commit:
            with self._lock, torch.inference_mode():
                self._commit(strat, tokens, seq, pre)
        return strat, pre, ttft

    def _prefill_cost(self, tokens: TokenizedPrompt) -> int:
        """About the tokens a prefill computes, for its place among waiting prefills
        (`prefill_order="shortest"`) and a burst's budget (`prefill_burst_tokens`): the
        prompt's text the store does not hold (a segment stored anywhere counts as found), and
        the last token. 0 when neither reads it."""
        if not (self._lock.shortest_first or self._lock.burst_tokens):
            return 0
        m, store = self.model, self.ctx.store
        cost = 1
        for seg in tokens.segments:
            cid = segment_content_id(seg.ids, seg.segment.scope)
            if not store.contains_content(m.model_id, m.tokenizer.tokenizer_id, cid):
                cost += seg.end - seg.start
        return cost

    def _chunked(
        self, strat: ReuseStrategy, tokens: TokenizedPrompt, seq: SequenceKV
    ) -> chunked.ChunkedPrefill | PrefillResult:
        """The prefill as chunks for the scheduler's steps: with batching, a chunk budget, and
        a plan the runtime runs in chunks (`runtime/chunked.py`); else its result, run whole."""
        chunk = self.config.prefill_chunk_tokens
        if self.batch is None or not chunk:
            return strat.prefill(self.ctx, tokens, seq)
        return chunked.plan(strat, self.ctx, tokens, seq, chunk)

    def _check_fits(self, prompt: TokenizedPrompt, params: GenerationParams) -> None:
        """With preemption, PoolCapacityError when the prompt and its max_new_tokens (within
        the model's positions) are more tokens than the whole pool holds: preempted by every
        other turn, it could not finish. (Without, such a turn runs when no other does and
        stops with "length" where the pool ends, as at the model's last position.)"""
        if self.config.preemption is None:
            return
        positions = self.model.config.max_position_embeddings
        n = min(prompt.num_tokens + params.max_new_tokens, positions)
        if n > self._pool_tokens:
            pool, c = self.pool_config, self.config
            holder = (f"the engine's KV pool ({pool.num_pages} pages of {c.page_size} tokens, "
                      f"{pool.pool_bytes} bytes)")  # fmt: skip
            what = f"prompt ({prompt.num_tokens}) + max_new_tokens ({params.max_new_tokens})"
            raise PoolCapacityError(n, self._pool_tokens, what, holder)

    def _pages_for(self, prompt: TokenizedPrompt, params: GenerationParams) -> int:
        """Pages a turn may fill: the prompt, its new tokens, the reply's closing tokens; with
        preemption, the pages of its prompt and first new token (the rest taken as it goes)."""
        if self.config.preemption is not None:
            return -(-min(prompt.num_tokens + 1, self.max_context) // self.config.page_size)
        tokens = min(prompt.num_tokens + params.max_new_tokens + REPLY_CLOSING, self.max_context)
        return -(-tokens // self.config.page_size)

    def _commit_reply(
        self,
        strat: ReuseStrategy,
        prompt: TokenizedPrompt,
        seq: SequenceKV,
        pre: PrefillResult,
        ids: list[int],
        segment: Segment | None,
    ) -> ReplyKV:
        """Store the prompt with the reply as the closed message that replaces the generation
        prompt next turn (`prompt.reply`): its KV is the generation prompt's (already in `seq`),
        the generated tokens' and the few closing tokens, computed here."""
        if segment is None:
            return ReplyKV.NO_REPLY
        if seq.num_tokens == 0:
            return ReplyKV.SPARSE_DECODE
        m = self.model
        full = close_reply(prompt, segment, m.tokenizer, m.chat_format)
        if full is None:
            return ReplyKV.NO_GENERATION_PROMPT
        n = prompt.num_tokens
        if full.ids[: n + len(ids)] != prompt.ids + tuple(ids):
            return ReplyKV.RETOKENIZED
        start = int(pre.positions.max().item()) + 1  # the first generated token's position
        extra = full.num_tokens - n  # tokens after the prompt
        if start + extra > m.config.max_position_embeddings:
            return ReplyKV.CONTEXT
        try:
            for i in range(seq.num_tokens - n, extra):  # not fed: the last token, the closing
                self.step(seq, full.ids[n + i], start + i)
        except OutOfPagesError:
            return ReplyKV.NO_ROOM
        positions = torch.cat([pre.positions, torch.arange(start, start + extra)])
        strat.commit(self.ctx, full, seq, positions)
        return ReplyKV.STORED

    def commit_reply(
        self, prompt: TokenizedPrompt, seq: SequenceKV, pre: PrefillResult,
        reply_ids: Sequence[int], segment: Segment, strategy: str | None = None,
    ) -> ReplyKV:  # fmt: skip
        """Store the prompt with a given reply, as `generate(reply=...)` stores a generated one:
        `reply_ids` are the tokens after the prompt (the reply's, then the message's closing
        ones), `seq` holds the prompt's KV only (after `prefill`). Returns whether it was
        stored, or why not."""
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
        """Prefill only; the caller owns the returned sequence and must `free()` it. Its pages
        are taken as needed, outside `gate`: beside `generate` calls of other threads it may
        find the pool short (`OutOfPagesError`)."""
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
        refill: Callable[[SequenceKV], None] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> tuple[list[int], str, DecodePart]:
        """Decode after prefill into `seq` with the configured decode policy's decoder;
        `refill` prefills the prompt again (the batched scheduler's preemption); `prepare`
        runs before the decoder is made (with batching, once the first token is out)."""
        max_pos = self.model.config.max_position_embeddings
        position = int(pre.positions.max().item()) + 1
        if position >= max_pos and params.max_new_tokens > 0:
            raise ContextLengthError(position + 1, max_pos, "prompt + 1 new token")
        t0 = time.perf_counter()
        pre_tokens = seq.num_tokens  # the prompt's, before any new token
        dense = DenseDecoder(self.step, seq, self._pool_tokens)
        # verified decoding chooses its tokens itself: greedy only, and with no token constraint
        # (structured outputs, logprobs) that the chosen tokens would bypass
        greedy = params.temperature == 0 and params.constraint is None

        def make_decoder() -> Decoder:
            """The turn's decoder: a sparse one's set-up (its KV copied into head pages) runs
            outside the engine's lock, beside other turns' steps (it reads only this turn's
            pages, which nothing else writes before the turn joins); what changes the pool
            runs under it."""
            if prepare is not None:
                prepare()
            sparse = self.decode.sparse_decoder(self.model, seq, params.max_new_tokens)
            with self._turn_lock(), torch.inference_mode():
                return self.decode.adopt(self.model, seq, greedy, dense, sparse)

        if self.batch is not None:
            ids, finish, decoder = self._decode_batched(
                make_decoder, pre, position, params, on_token, refill
            )
        else:
            inner = make_decoder()
            self.gate.wake()  # a sparse decoder gave back the pages beyond its fast tier
            decoder = LockedDecoder(inner, self._lock)
            with torch.inference_mode():
                ids, finish = decode_loop(
                    decoder, pre.logits, position, params, max_pos, self.model.tokenizer, on_token
                )
        elapsed = time.perf_counter() - t0
        d = self.decode
        short = d.short_reason(pre_tokens, params.max_new_tokens)
        reason = d.fallback_reason or short
        kind = "profile" if d.fallback_reason else "short" if short else None
        decode = DecodePart(
            decode_tokens=len(ids), decode_tokens_per_s=len(ids) / elapsed if elapsed > 0 else 0.0,
            decode_policy="dense" if reason else d.policy, decode_fallbacks=int(reason is not None),
            decode_fallback_reason=reason, decode_fallback_kind=kind, decode=decoder.stats(),
        )  # fmt: skip
        return ids, finish, decode

    def _decode_batched(
        self,
        make_decoder: Callable[[], Decoder],
        pre: PrefillResult,
        position: int,
        params: GenerationParams,
        on_token: Callable[[int], None] | None,
        refill: Callable[[SequenceKV], None] | None = None,
    ) -> tuple[list[int], str, Decoder]:
        """`decode_loop`'s result, the turn decoded in the scheduler's batch with the others,
        and its decoder."""
        assert self.batch is not None
        max_pos = self.model.config.max_position_embeddings
        turn = TurnDecoding(pre.logits, position, params, max_pos, self.model.tokenizer)
        # the first token comes from the prefill's logits: chosen and handed over here, before
        # the engine's lock is asked again (the decoder's set-up), not after the next step's
        # forward (the turn joins with its token chosen, to be fed)
        token = turn.choose() if turn.finish is None else None
        if token is not None and on_token is not None:
            on_token(token)
        decoder = make_decoder()
        self.gate.wake()  # a sparse decoder gave back the pages beyond its fast tier
        if turn.finish is not None:  # nothing (more) to decode
            return turn.ids, turn.finish, decoder
        running = self.batch.join(turn, decoder, refill, chosen=True)
        try:
            for token in self.batch.tokens(running):
                if on_token is not None:
                    on_token(token)
        finally:
            self.batch.leave(running)
        assert turn.finish is not None
        return turn.ids, turn.finish, decoder
