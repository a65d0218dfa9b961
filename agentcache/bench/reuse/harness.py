"""Run strategies side by side on the same turns and measure TTFT and fidelity vs `full`.

Per turn: `full` prefills and greedily continues (the reference tokens and logits), the limit
is timed (only update tokens computed, all other KV resident), then every other strategy, in
an order rotated turn by turn, prefills (timed) and is teacher-forced along the reference
tokens. Greedy agreement follows from teacher forcing: greedy decoding matches the reference
exactly as long as the teacher-forced argmax does. Each strategy has its own engine and store.
The `transformers-prefix` peer (bench/peer.py) takes a strategy's place in that order and
fills the same record fields.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from agentcache.bench.peer import PEER, TransformersPrefix
from agentcache.bench.reuse.metrics import cksim_by_layer, fidelity
from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.reply import close_reply
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import PrefillResult, ReuseStats, compute_subset
from agentcache.reuse.planner import plan_fields
from agentcache.reuse.spec import StrategySpec
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.workload.files import Session, Turn


def parse_specs(text: str) -> list[StrategySpec]:
    """Strategy specs, `full` first; `transformers-prefix` names the peer (bench/peer.py)."""
    specs = [_spec(t) for t in text.split(",") if t.strip()]
    if not any(s.label == "full" for s in specs):
        specs.insert(0, StrategySpec("full", "full"))  # the reference is always measured
    return specs


def _spec(text: str) -> StrategySpec:
    return StrategySpec(PEER, PEER) if text.strip() == PEER else StrategySpec.parse(text)


def sweep_specs() -> list[StrategySpec]:
    """cacheslide over rho and tau, cacheblend over r, epic and rpdc over their budgets (and
    rpdc's probe window, and its earlier default)."""
    texts = [f"cacheslide:ratio={r}" for r in (0.1, 0.5)]
    texts += [f"cacheslide:tau={t}" for t in (0.05, 0.3)]
    texts += ["cacheslide:plan=mode", "cacheslide:promotion=catch-up", "cacheslide:fusion=replace"]
    texts += [f"cacheblend:ratio={r}" for r in (0.05, 0.3, 0.5)]
    texts += [f"epic:boundary_k={k}" for k in (16, 32)]
    texts += [f"rpdc:extra={e}" for e in (0.1, 0.5, 1.0)] + ["rpdc:selection=random"]
    texts += ["rpdc:probe_window=256", "rpdc:ratio=0.3:probe_window=256"]  # the earlier default
    return [StrategySpec.parse(t) for t in texts]


Progress = Callable[[str], None]


class BenchRunner:
    def __init__(
        self, model: LoadedModel, specs: list[StrategySpec], kv_pages: int = 1024,
        peer: TransformersPrefix | None = None,
    ) -> None:  # fmt: skip
        """`peer` runs the `transformers-prefix` spec (its HF model on `model`'s weights)."""
        if any(s.label == PEER for s in specs) and peer is None:
            raise ConfigError(f"{PEER} needs the checkpoint's transformers model (peer=...)")
        self.model = model
        self.windows = [la.window for la in model.forward.spec.layers]  # cksim: rows read
        self.specs = specs
        self.kv_pages = kv_pages
        self.peer = peer

    def engine_config(self, spec: StrategySpec) -> EngineConfig:
        """The configuration of `spec`'s engine (a fresh engine and store per session)."""
        options = {spec.name: spec.options}
        return EngineConfig(strategy=spec.name, kv_pages=self.kv_pages, strategy_options=options)

    def _engines(self) -> dict[str, Engine]:
        return {
            s.label: Engine(self.model, self.engine_config(s))
            for s in self.specs
            if s.label != PEER
        }

    def run_session(self, session: Session, advance: Progress) -> list[dict[str, Any]]:
        engines = self._engines()
        full = engines["full"]
        others = [s for s in self.specs if s.label != "full"]
        if self.peer is not None:
            self.peer.reset()
        records = []
        for ti, turn in enumerate(session.turns):
            prompt = full.tokenize(turn.prompt)
            n = max(1, turn.max_new_tokens)
            seq, pre, ttft_full = _timed_prefill(full, prompt, "full")
            ref_tokens, ref_logits = _greedy(full, seq, pre, n)
            ref_keys = seq.gather_all(slice(0, prompt.num_tokens))[0]
            ttft_limit = _limit(full, prompt, seq)
            seq.free()
            base: dict[str, Any] = {
                "session": session.name,
                "workload": session.workload,
                "case": session.case,
                "split": session.split,
            }
            base |= {"turn": ti, "prompt_tokens": prompt.num_tokens}
            base |= {"ttft_full_ms": ttft_full * 1e3, "ttft_limit_ms": ttft_limit * 1e3}
            records.append(self._record(base, "full", full, pre, ttft_full, ref_logits, ref_logits,
                                        ref_tokens, ref_keys, ref_keys))  # fmt: skip
            advance("full")
            shift = ti % max(1, len(others))
            for spec in others[shift:] + others[:shift]:
                if spec.label == PEER:
                    records.append(self._peer_record(base, turn, prompt, ref_logits, ref_tokens,
                                                     ref_keys))  # fmt: skip
                    advance(PEER)
                    continue
                engine = engines[spec.label]
                seq, pre, ttft = _timed_prefill(engine, prompt, spec.name)
                prompt_kv = _copy_kv(engine, seq, prompt.num_tokens) if turn.reply else None
                logits = _teacher_force(engine, seq, pre, ref_tokens)
                keys = seq.gather_all(slice(0, prompt.num_tokens))[0]
                engine.commit(prompt, seq, pre, spec.name)
                seq.free()
                reply_kv = _store_reply(engine, prompt, prompt_kv, pre, turn.reply, spec.name)
                record = self._record(base, spec.label, engine, pre, ttft, ref_logits, logits,
                                      ref_tokens, ref_keys, keys)  # fmt: skip
                records.append(record | {"reply_kv": reply_kv})
                advance(spec.label)
        return records

    def _peer_record(
        self, base: dict[str, Any], turn: Turn, prompt: TokenizedPrompt, ref_logits: Tensor,
        ref_tokens: list[int], ref_keys: Tensor,
    ) -> dict[str, Any]:  # fmt: skip
        """The `transformers-prefix` peer's turn, in a strategy's record fields."""
        assert self.peer is not None
        peer, n = self.peer, prompt.num_tokens
        t0 = time.perf_counter()
        first, reused = peer.prefill(prompt.ids)
        ttft = time.perf_counter() - t0
        logits = torch.stack([first, *(peer.step(t) for t in ref_tokens[:-1])])
        keys, kv_bytes = peer.keys(n), peer.cache_bytes()
        if turn.reply is not None:  # the next request holds this reply: as if generated
            peer.extend_to(prompt.ids, reply_tokens(self.model, prompt, turn.reply))
        return (
            base
            | {
                "strategy": PEER, "ttft_ms": ttft * 1e3, "reused_tokens": reused,
                "recomputed_tokens": n - reused, "recompute_fraction": (n - reused) / n,
                "load_ms": 0.0, "fallbacks": 0, "probe_skipped": False, "misses": [],
                "fast_tier_kv_bytes_peak": kv_bytes, "store_bytes_peak": kv_bytes,
                "cksim_by_layer": cksim_by_layer(ref_keys, keys, self.windows), "reply_kv": None,
            }
            | fidelity(ref_logits, ref_tokens, logits)
        )  # fmt: skip

    def _record(
        self,
        base: dict[str, Any],
        label: str,
        engine: Engine,
        pre: PrefillResult,
        ttft: float,
        ref_logits: Tensor,
        logits: Tensor,
        ref_tokens: list[int],
        ref_keys: Tensor,
        keys: Tensor,
    ) -> dict[str, Any]:
        s: ReuseStats = pre.stats
        pool = engine.ctx.pool
        return (
            base
            | {
                "strategy": label,
                "ttft_ms": ttft * 1e3,
                "overhead_ms": s.overhead_s * 1e3,
                "reused_tokens": s.reused_tokens,
                "recomputed_tokens": s.recomputed_tokens,
                "recompute_fraction": s.recompute_fraction,
                "load_ms": s.load_s * 1e3,
                "fallbacks": s.fallbacks,
                "probe_skipped": s.probe_skipped,
                "epic_turn": s.epic_turn,  # `epic_over`: chunk starts instead of a ranking
                "guarded": s.guarded,  # the plan cost more than recomputing: full's ran
                "model_calls": s.model_calls,
                "loaded_tokens": s.loaded_tokens,
                "candidates": s.candidates,
                "computed_anyway": s.computed_anyway,
                "misses": [m.reason.value for m in s.misses],
                "fast_tier_kv_bytes_peak": pool.peak_pages_used * pool.config.page_bytes,
                "store_bytes_peak": engine.store.stats.peak_bytes,
                "cksim_by_layer": cksim_by_layer(ref_keys, keys, self.windows),
            }
            | plan_fields(s)
            | fidelity(ref_logits, ref_tokens, logits)
        )


def _timed_prefill(
    engine: Engine, prompt: TokenizedPrompt, name: str
) -> tuple[SequenceKV, PrefillResult, float]:
    t0 = time.perf_counter()
    seq, pre = engine.prefill(prompt, name)
    return seq, pre, time.perf_counter() - t0


def _greedy(
    engine: Engine, seq: SequenceKV, pre: PrefillResult, n: int
) -> tuple[list[int], Tensor]:
    position = int(pre.positions.max()) + 1
    logits, tokens = [pre.logits], []
    for _ in range(n):
        tokens.append(int(logits[-1].argmax()))
        if len(tokens) == n:
            break
        logits.append(engine.step(seq, tokens[-1], position))
        position += 1
    return tokens, torch.stack(logits)


def _teacher_force(
    engine: Engine, seq: SequenceKV, pre: PrefillResult, tokens: list[int]
) -> Tensor:
    position = int(pre.positions.max()) + 1
    logits = [pre.logits]
    for token in tokens[:-1]:
        logits.append(engine.step(seq, token, position))
        position += 1
    return torch.stack(logits)


def _copy_kv(engine: Engine, source: SequenceKV, num_tokens: int) -> SequenceKV:
    """A new sequence holding a copy of `source`'s first `num_tokens` tokens' KV (the caller
    frees it)."""
    seq = SequenceKV(engine.ctx.pool)
    try:
        seq.extend(num_tokens)
        keys, values = source.gather_all(slice(0, num_tokens))
        seq.write_all(seq.slots(), keys, values)
    except BaseException:
        seq.free()
        raise
    return seq


def _store_reply(
    engine: Engine, prompt: TokenizedPrompt, seq: SequenceKV | None, pre: PrefillResult,
    reply: Segment | None, name: str,
) -> str | None:  # fmt: skip
    """Store a chat turn's reply as the server does when it generates it (the workload's reply
    in place of the model's); `seq` holds the prompt's KV and is freed. "stored", or why not
    (runtime.stats.ReplyKV); None for a turn without a reply."""
    if seq is None or reply is None:
        return None
    try:
        after_prompt = reply_tokens(engine.model, prompt, reply)
        return engine.commit_reply(prompt, seq, pre, after_prompt, reply, name)
    finally:
        seq.free()


def reply_tokens(model: LoadedModel, prompt: TokenizedPrompt, reply: Segment) -> list[int]:
    """The tokens after `prompt` once `reply` closes it (`close_reply`): what the model
    generates for the reply, then the message's closing tokens; none when the prompt does not
    end in the generation prompt."""
    closed = close_reply(prompt, reply, model.tokenizer, model.chat_format)
    return [] if closed is None else list(closed.ids[prompt.num_tokens :])


def _limit(engine: Engine, prompt: TokenizedPrompt, full_seq: SequenceKV) -> float:
    """TTFT of a perfect cache: only update tokens (and the last) computed, all else resident."""
    seq = _copy_kv(engine, full_seq, prompt.num_tokens)
    try:
        update = torch.zeros(prompt.num_tokens, dtype=torch.bool)
        for s in prompt.segments:
            if s.kind == SegmentKind.UPDATE:
                update[s.start : s.end] = True
        update[-1] = True
        stats = ReuseStats(prompt.num_tokens, engine.model.config.num_layers)
        with torch.inference_mode():
            t0 = time.perf_counter()
            compute_subset(engine.ctx, prompt, seq, update.nonzero().flatten(), stats)
            return time.perf_counter() - t0
    finally:
        seq.free()
