"""`agentcache bench-decode`: decode policies side by side on long prompts, one prefill each.

Every policy decodes greedily from the same prefilled KV for `new_tokens` steps (end-of-text
does not stop it). Dense is the engine's own paged decode (`Engine.step`); the others run
`SparseDecoder`. Per policy: fast-tier KV bytes, tokens/s over the whole decode, greedy
agreement with dense (free-running, position by position), teacher-forced top-1 agreement
along dense's tokens, rerank cost and bytes promoted per rerank. A policy spec with `verify=K`
decodes self-speculatively (sparse drafts of K tokens, one dense pass each); its tokens/s counts
the drafting, the dense passes and the rejected drafts.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from agentcache.bench.decode.needle import NEEDLE, SECRET, needle_prompt, needle_prompts
from agentcache.bench.decode.summary import summarize
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.setup import DecodeSetup
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Engine, EngineConfig

PAGE = 16
Step = Callable[[int, int], Tensor]


@dataclass(frozen=True)
class DecodeBenchSettings:
    context: int = 8192  # prompt + new tokens: the KV length at the last step
    new_tokens: int = 256
    policies: tuple[str, ...] = ("dense", "flexicache", "multiscale")
    budget_pages: int = 64
    gqa_combine: str = "sum"
    teacher_forced: bool = True
    needle_tokens: int = 0  # > 0: also decode this many tokens on a planted-needle prompt
    needle_prompts: int = 0  # needle prompts (needle at depths 0.1..0.9) besides the prompts

    def __post_init__(self) -> None:
        if self.new_tokens < 1 or self.context <= self.new_tokens:
            raise ValueError("need new_tokens >= 1 and context > new_tokens")
        if "dense" not in self.policies:
            raise ValueError("the policies must include dense, the reference")
        if self.needle_prompts < 0:
            raise ValueError(f"needle_prompts must be >= 0, got {self.needle_prompts}")

    @property
    def prompt_tokens(self) -> int:
        return self.context - self.new_tokens


@dataclass(frozen=True)
class Run:
    tokens: list[int]
    step_s: list[float]
    setup_s: float
    stats: dict[str, Any] | None
    fast_tier_kv_bytes: int
    metadata_bytes: int


def run_decode_bench(
    model: LoadedModel,
    prompts: list[TokenizedPrompt],
    settings: DecodeBenchSettings,
    setups: dict[str, DecodeSetup],
    on_step: Callable[[str], None] | None = None,
    texts: list[str] | None = None,
) -> dict[str, Any]:
    """Results keyed by policy (see module doc), plus per-prompt records; `setups` holds every
    policy spec's resolved plan. The needle prompt's haystack comes from `texts` (default: the
    first prompt's text)."""
    engine = Engine(model, EngineConfig(strategy="full", kv_pages=2 + settings.context // PAGE))
    haystack = texts or [model.tokenizer.decode(list(prompts[0].ids))]
    needles = needle_prompts(model, haystack, settings.prompt_tokens, settings.needle_prompts)
    per_prompt = []
    for kind, prompt in [*(("text", p) for p in prompts), *(("needle", p) for p in needles)]:
        seq, pre = engine.prefill(prompt)
        try:
            keys, values = seq.gather_all(slice(0, seq.num_tokens))
        finally:
            seq.free()
        first = int(pre.logits.argmax())
        start = int(pre.positions.max()) + 1
        runs: dict[str, dict[str, Any]] = {}
        dense = _run_dense(engine, keys, values, first, start, settings.new_tokens, on_step)
        for name in settings.policies:
            run = dense if name == "dense" else None
            forced: list[int] | None = None
            if run is None:
                build = _sparse_builder(model, setups[name], keys, values, settings)
                run = greedy_run(build, first, start, settings.new_tokens, None, on_step)
                if settings.teacher_forced and not setups[name].config.verify:
                    forced = greedy_run(
                        build, first, start, settings.new_tokens, dense.tokens, on_step
                    ).tokens
            runs[name] = _record(run, dense, forced)
            if kind == "needle":
                runs[name]["needle_found"] = SECRET in model.tokenizer.decode(run.tokens)
        per_prompt.append({"kind": kind, "prompt_tokens": prompt.num_tokens, "policies": runs})
    summary = summarize(per_prompt, settings.policies, settings.teacher_forced)
    out: dict[str, Any] = {"policies": summary, "per_prompt": per_prompt}
    if settings.needle_tokens:
        out["needle"] = _needle(engine, setups, settings, haystack, on_step)
        for name, rec in out["needle"]["policies"].items():
            summary[name]["needle_found"] = rec["found"]
            summary[name]["needle_answer_same_as_dense"] = rec["same_as_dense"]
    return out


def _needle(
    engine: Engine,
    setups: dict[str, DecodeSetup],
    settings: DecodeBenchSettings,
    texts: list[str],
    on_step: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Greedy answers of every policy to a question about a needle planted mid-context."""
    model = engine.model
    prompt = needle_prompt(model, texts, settings.prompt_tokens)
    seq, pre = engine.prefill(prompt)
    try:
        keys, values = seq.gather_all(slice(0, seq.num_tokens))
    finally:
        seq.free()
    first, start, n = int(pre.logits.argmax()), int(pre.positions.max()) + 1, settings.needle_tokens
    dense = _run_dense(engine, keys, values, first, start, n, on_step)
    answers = {"dense": dense.tokens}
    for name in settings.policies:
        if name != "dense":
            build = _sparse_builder(model, setups[name], keys, values, settings)
            answers[name] = greedy_run(build, first, start, n, None, on_step).tokens
    decoded = {name: model.tokenizer.decode(ids) for name, ids in answers.items()}
    return {
        "needle": NEEDLE.strip(),
        "secret": SECRET,
        "policies": {
            name: {
                "answer": text,
                "found": SECRET in text,
                "same_as_dense": answers[name] == answers["dense"],
            }
            for name, text in decoded.items()
        },
    }


def _run_dense(
    engine: Engine,
    keys: Tensor,
    values: Tensor,
    first: int,
    start: int,
    n: int,
    on_step: Callable[[str], None] | None,
) -> Run:
    run = pool_run(engine, engine.step, keys, values, (first, start, n), on_step)
    pages = -(-(keys.shape[1] + n) // PAGE)
    return Run(run.tokens, run.step_s, 0.0, None, pages * engine.ctx.pool.config.page_bytes, 0)


def pool_run(
    engine: Engine,
    step: Callable[[SequenceKV, int, int], Tensor],
    keys: Tensor,
    values: Tensor,
    start: tuple[int, int, int],
    on_step: Callable[[str], None] | None,
) -> Run:
    """Greedy decode by `step` over a sequence of the engine's pool holding `keys`/`values`
    (L, T, Hkv, Dh); `start` = (first token, its position, tokens to generate)."""
    seq = SequenceKV(engine.ctx.pool)
    try:
        seq.write_all(seq.extend(keys.shape[1]), keys, values)
        return greedy_run(lambda: lambda tok, pos: step(seq, tok, pos), *start, None, on_step)
    finally:
        seq.free()


def _sparse_builder(
    model: LoadedModel,
    setup: DecodeSetup,
    keys: Tensor,
    values: Tensor,
    settings: DecodeBenchSettings,
) -> Callable[[], SparseDecoder]:
    max_tokens = keys.shape[1] + max(settings.new_tokens, settings.needle_tokens)

    def build() -> SparseDecoder:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a clamped budget is reported in the stats
            return SparseDecoder(model.forward, setup.plan, setup.config, keys, values, max_tokens)

    return build


def greedy_run(
    build: Callable[[], Any],
    first: int,
    start: int,
    n: int,
    forced: list[int] | None,
    on_step: Callable[[str], None] | None = None,
) -> Run:
    """Greedy decode of n tokens (or along `forced`, recording the argmax at each step)."""
    with torch.inference_mode():
        t0 = time.perf_counter()
        target = build()
        setup_s = time.perf_counter() - t0
        if isinstance(target, SparseDecoder) and target.config.verify and forced is None:
            tokens, times = _run_verified(target, first, start, n, on_step)
            return _finish(target, tokens, times, setup_s)
        step: Step = target.step if isinstance(target, SparseDecoder) else target
        tokens, times, token = [first], [], first
        for i in range(n - 1):
            feed = forced[i] if forced is not None else token
            t0 = time.perf_counter()
            logits = step(feed, start + i)
            times.append(time.perf_counter() - t0)
            token = int(logits.argmax())
            tokens.append(token)
            if on_step:
                on_step("tf" if forced else "run")
    return _finish(target, tokens, times, setup_s)


def _run_verified(
    dec: SparseDecoder, first: int, start: int, n: int, on_step: Callable[[str], None] | None
) -> tuple[list[int], list[float]]:
    """Self-speculative greedy decode of n tokens; `times` holds each advance's duration."""
    tokens, times = [first], []
    while len(tokens) < n:
        t0 = time.perf_counter()
        got = dec.advance(
            tokens[-1], start + len(tokens) - 1, min(dec.config.verify, n - len(tokens))
        )
        times.append(time.perf_counter() - t0)
        kept = got[: n - len(tokens)]
        tokens += kept
        if on_step:
            for _ in kept:
                on_step("run")
    return tokens, times


def _finish(target: Any, tokens: list[int], times: list[float], setup_s: float) -> Run:
    if isinstance(target, SparseDecoder):
        s = target.stats()
        stats = {
            **asdict(s),
            "bytes_promoted_per_rerank": s.bytes_promoted_per_rerank,
            "acceptance": s.acceptance,
        }
        return Run(tokens, times, setup_s, stats, s.fast_tier_kv_bytes, s.metadata_bytes)
    return Run(tokens, times, setup_s, None, 0, 0)


def _record(run: Run, dense: Run, forced: list[int] | None) -> dict[str, Any]:
    agree = [a == b for a, b in zip(run.tokens, dense.tokens, strict=True)]
    prefix = agree.index(False) if False in agree else len(agree)
    rec: dict[str, Any] = {
        "tokens": run.tokens,
        "step_s": run.step_s,
        "setup_s": run.setup_s,
        "fast_tier_kv_bytes": run.fast_tier_kv_bytes,
        "metadata_bytes": run.metadata_bytes,
        "greedy_agreement_with_dense": sum(agree) / len(agree),
        "greedy_agree_prefix": prefix,
        "decode": run.stats,
    }
    if forced is not None:  # forced[i+1] is the argmax after dense's first i+1 tokens
        tf = [a == b for a, b in zip(forced[1:], dense.tokens[1:], strict=True)]
        rec["teacher_forced_top1_agreement"] = sum(tf) / len(tf)
    return rec
