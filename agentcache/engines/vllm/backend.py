"""`VLLMBackend`: agentcache prompts executed by vLLM, with the same `generate` as `Engine`.

The prompt is tokenized segment by segment with agentcache's own rules (so segment ids, and
therefore store keys, are the ones the embedded engine uses), sent to vLLM as token ids, and
its segment spans travel in `kv_transfer_params` to the connector. Three reuse settings:

    agentcache  vLLM's prefix cache + agentcache's connector (segments, shared store)
    prefix      vLLM's prefix cache alone (the baseline)
    none        no reuse at all (the reference for fidelity)

Requests go through vLLM's engine step by step (`LLMEngine.add_request` / `step`, what
`LLM.generate` does inside), so each new token reaches `on_token` as soon as vLLM returns it
(streaming) and `ttft_s` is the time to the first token.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentcache.engines.vllm import require_vllm
from agentcache.engines.vllm.config import (
    FILL_MODES,
    REUSE_MODES,
    ConnectorSettings,
    default_model_folder,
    kv_transfer_config,
)
from agentcache.engines.vllm.identity import model_identity, store_model_id
from agentcache.engines.vllm.reports import merge_counts, read_report
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.stages import (
    FillChooser,
    Stage,
    StagePlan,
    engine_tokens,
    exact_prefix_tokens,
    plan_prompt,
    plan_stages,
    select_from_store,
    staged_strategy,
)
from agentcache.engines.vllm.storage import FolderSegmentStore, StoredMeta
from agentcache.kv.store import MissReason, segment_content_id
from agentcache.model.loading import DEFAULT_MODEL
from agentcache.model.tokenizer import HFTokenizer, chat_format_for
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment, tokenize_prompt
from agentcache.reuse import DEFAULT_STRATEGY, StrategySpec
from agentcache.reuse.base import SegmentMiss
from agentcache.reuse.selective import SelectiveRecompute
from agentcache.runtime.engine import Generation, GenerationParams, TurnStats
from agentcache.units import GiB


@dataclass(frozen=True)
class VLLMConfig:
    model: str | None = None  # model folder; None: the embedded default, converted once
    reuse: str = "agentcache"
    strategy: str = DEFAULT_STRATEGY
    min_reused_fraction: float = 0.5  # see ConnectorSettings
    store_dir: str | None = None  # shared segment folder (default ~/.cache/agentcache/vllm-store)
    store_bytes: int = 2 * GiB
    kv_cache_bytes: int = 1 * GiB  # vLLM's own paged KV memory
    max_model_len: int = 8192
    block_size: int = 32  # a multiple of 32 on CPU
    dtype: str = "float32"
    logprobs: int = 20  # top log-probabilities kept for `first_token_logits`
    in_process: bool = True  # run vLLM's engine core in this process (no spawn)
    # who computes what reuse cannot supply (config.FILL_MODES): "vllm" runs staged prefills
    # (stages.py: positional strategies only), "engine" agentcache's engine in the worker,
    # "auto" staged where the strategy allows it
    fill: str = "auto"
    min_stage_tokens: int = 64  # a reused run shorter than this is computed, not staged

    def __post_init__(self) -> None:
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")
        if self.fill not in FILL_MODES:
            raise ValueError(f"fill must be one of {FILL_MODES}, got {self.fill!r}")
        if self.min_stage_tokens < 1:
            raise ValueError(f"min_stage_tokens must be >= 1, got {self.min_stage_tokens}")
        spec = StrategySpec.parse(self.strategy)
        if self.reuse == "agentcache" and self.fill == "vllm":
            staged_strategy(spec)  # a clear error now for one that cannot be staged

    @property
    def strategy_name(self) -> str:
        return self.strategy


class VLLMBackend:
    """An execution engine with `Engine`'s session surface (`config.strategy`, `strategy()`,
    `tokenize()`, `generate()`), so `AgentSession` runs on it unchanged, and its serving
    surface (`tokenizer`, `max_context`, `model_id`, `store_bytes()`), so `agentcache serve`
    does. Requests are serialized by a lock (vLLM's engine is driven from one thread at a
    time), as the embedded engine serializes them."""

    def __init__(self, config: VLLMConfig | None = None, cache_dir: Path | None = None) -> None:
        self.config = config or VLLMConfig()
        c = self.config
        vllm = require_vllm()
        from transformers import AutoTokenizer

        folder = Path(c.model) if c.model else default_model_folder(cache_dir)
        name = DEFAULT_MODEL if c.model is None else folder.name
        self.folder = folder
        self.tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder), name)
        self.chat_format = chat_format_for(self.tokenizer.vocab)
        self.vocab_size = int(_config_value(folder, "vocab_size"))
        kwargs: dict[str, Any] = {
            "model": str(folder),
            "enforce_eager": True,
            "dtype": c.dtype,
            "max_model_len": c.max_model_len,
            "max_num_batched_tokens": c.max_model_len,  # one step per prompt: no chunking
            "block_size": c.block_size,
            "enable_prefix_caching": c.reuse != "none",
            "kv_cache_memory_bytes": c.kv_cache_bytes,
            "gpu_memory_utilization": 0.1,  # on CPU: the share of RAM checked at start-up
            "disable_log_stats": True,
        }
        self.store_dir = c.store_dir or ConnectorSettings().store_dir
        self.scope_key = secrets.token_hex(16)  # signs the scopes this backend issues
        if c.reuse == "agentcache":
            settings = ConnectorSettings(
                store_dir=self.store_dir,
                store_bytes=c.store_bytes,
                strategy=c.strategy,
                model_name=name,
                min_reused_fraction=c.min_reused_fraction,
                fill=c.fill,
                scope_key=self.scope_key,
            )
            kwargs["kv_transfer_config"] = kv_transfer_config(settings)
        if c.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.llm = vllm.LLM(**kwargs)
        ident = model_identity(folder, name)
        self.model_id = ident.model_id
        # the store as a staged prefill plans from it: metadata only, no KV held here
        self._plan_store = FolderSegmentStore(Path(self.store_dir), 0)
        self._store_ids = (store_model_id(ident.model_id, getattr(torch, c.dtype)),
                           ident.tokenizer_id)  # fmt: skip
        self.last_transfer: dict[str, Any] = {}  # the connector's report on the latest turn
        self._choosers: dict[str, FillChooser] = {}  # fill="auto": per strategy spec
        self._lock = threading.Lock()

    @property
    def max_context(self) -> int:
        return self.config.max_model_len

    @property
    def context_holder(self) -> str | None:
        return "vLLM's max_model_len"

    def store_bytes(self) -> dict[str, int]:
        """Bytes of KV in the shared segment folder (the store every vLLM process reads)."""
        if self.config.reuse != "agentcache":
            return {}
        root = Path(self.store_dir)
        files = root.glob("??/*.kv") if root.is_dir() else ()
        return {"folder": sum(f.stat().st_size for f in files if f.is_file())}

    def strategy(self, name: str | None = None) -> str:
        """Validate a strategy spec (unknown names list the known ones)."""
        name = name or self.config.strategy
        StrategySpec.parse(name)
        return name

    def staged(self, strategy: str | None = None) -> SelectiveRecompute | None:
        """The strategy a turn runs as a staged prefill (vLLM computes every token), or None
        when the turn goes to the connector's engine (or there is no connector)."""
        built = self._selective(strategy)
        return built if built is not None and built.up_front else None

    def _selective(self, strategy: str | None) -> SelectiveRecompute | None:
        """The selective strategy whose turns can leave computing to vLLM (checked to run
        staged under `fill="vllm"`), or None when the connector's engine fills every turn: no
        connector, `fill="engine"`, or a strategy that is not selective (full, prefix, ...)."""
        c = self.config
        if c.reuse != "agentcache" or c.fill == "engine":
            return None
        spec = StrategySpec.parse(self.strategy(strategy))
        built = staged_strategy(spec) if c.fill == "vllm" else spec.build()
        return built if isinstance(built, SelectiveRecompute) else None

    def stage_plan(self, tokens: TokenizedPrompt, strategy: SelectiveRecompute) -> StagePlan:
        """Which tokens vLLM computes, and in which requests, from what the store holds now."""
        c = self.config
        return plan_prompt(tokens, strategy, self._meta, c.block_size, c.min_stage_tokens)

    def _meta(self, seg: TokenizedSegment) -> StoredMeta | None:
        model_id, tokenizer_id = self._store_ids
        cid = segment_content_id(seg.ids, seg.segment.scope)
        return self._plan_store.meta(model_id, tokenizer_id, cid)

    def tokenize(self, prompt: SegmentedPrompt) -> TokenizedPrompt:
        return tokenize_prompt(prompt, self.tokenizer, self.chat_format, self.config.max_model_len)

    def sampling_params(
        self,
        tokens: TokenizedPrompt,
        params: GenerationParams,
        strategy: str | None,
        stage: Stage | None = None,
        min_reused: float | None = None,
    ) -> Any:
        """vLLM's parameters for a turn, or for the last stage of its staged prefill."""
        from vllm import SamplingParams

        extra: dict[str, Any] = {}
        if self.config.reuse == "agentcache":
            spec = RequestSpec.from_prompt(tokens, self.strategy(strategy))
            spec = replace(spec, min_reused=min_reused)
            if stage is not None:
                spec = replace(spec, strategy=None, stage=stage.claim or (0, 0))
            extra["kv_transfer_params"] = spec.with_report(uuid.uuid4().hex).to_params(
                self.scope_key
            )
        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            max_tokens=max(1, params.max_new_tokens),
            stop=list(params.stop) or None,
            logprobs=self.config.logprobs,
            stop_token_ids=sorted(self.tokenizer.eos_token_ids),
            extra_args=extra,
        )

    def generate(
        self,
        prompt: SegmentedPrompt | TokenizedPrompt,
        params: GenerationParams | None = None,
        strategy: str | None = None,
        commit: bool = True,
        on_token: Callable[[int], None] | None = None,
        reply: Callable[[str], Segment | None] | None = None,
    ) -> Generation:
        """Run one turn on vLLM. `on_token` gets each new token id as vLLM's engine step returns
        it (end-of-sequence ids excluded, as the embedded engine does); `ttft_s` is the time from
        submitting the request to its first token. A reply's KV is not stored (`reply_kv`)."""
        if not commit:
            raise ValueError("the vLLM backend always stores a turn's segments (commit=False)")
        params = params or GenerationParams()
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        with self._lock:
            plan, fill, chosen = self._decide(tokens, strategy)
            if fill == "engine":
                floor = 0.0 if chosen else None  # chosen on measurements: no share threshold
                sp = self.sampling_params(tokens, params, strategy, min_reused=floor)
                out, ttft, wall = self._run(tokens.ids, sp, on_token)
                info = self.transfer_report(sp, out)
                # vLLM computed what it had not cached (its prefix cache + the connector's
                # span); the connector's engine computed `computed_tokens` more (the last
                # token counted twice)
                computed = tokens.num_tokens - int(out.num_cached_tokens or 0)
                computed = min(tokens.num_tokens, computed + int(info.get("computed_tokens", 0)))
            else:
                assert plan is not None
                out, ttft, wall, info = self._run_staged(tokens, params, strategy, plan, on_token)
                computed = int(info["vllm_computed_tokens"])
            if chosen:
                self.chooser(strategy).observe(fill, ttft * 1e3, computed)
            info["fill"] = fill
        comp = out.outputs[0]
        ids = self._token_ids(comp.token_ids)[: params.max_new_tokens]
        finish = "stop" if comp.finish_reason == "stop" else "length"
        decode_s = wall - ttft
        stats = TurnStats(
            self.report_strategy(strategy),
            tokens.num_tokens, tokens.num_tokens - computed, computed,
            computed / max(1, tokens.num_tokens), ttft, len(ids),
            (len(ids) - 1) / decode_s if len(ids) > 1 and decode_s > 0 else 0.0,
            int(info.get("fallbacks", 0)), tuple(info.get("fallback_reasons", ())),
            _misses(info.get("misses", ())), reply_kv=None if reply is None else "backend",
        )  # fmt: skip
        text = _cut_at_stop(self.tokenizer.decode(ids), params.stop)
        return Generation(text, ids, finish, self._first_logits(comp.logprobs), stats)

    def _decide(
        self, tokens: TokenizedPrompt, strategy: str | None
    ) -> tuple[StagePlan | None, str, bool]:
        """(stages to run or None, fill, whether the fill was chosen on measurements)."""
        c = self.config
        built = self._selective(strategy)
        if built is None:
            return None, "engine", False
        if built.up_front:
            plan = self.stage_plan(tokens, built)
            if c.fill == "vllm" or plan.num_reused == 0:
                return plan, "vllm", False  # nothing to reuse: vLLM computes it either way
            chooser = self.chooser(strategy)
            return plan, chooser.choose(plan.num_computed, plan.requested), True
        # the strategy ranks tokens while it runs: its engine fills the span, or vLLM computes
        # the span itself (no reuse after vLLM's own prefix-cache hit)
        selection, runs = select_from_store(tokens, built, self._meta)
        if not runs:
            return None, "engine", False  # nothing stored: the connector claims nothing
        hit = exact_prefix_tokens(runs, c.block_size)
        fill = self.chooser(strategy).choose(tokens.num_tokens - hit, engine_tokens(selection))
        alone = plan_stages([True] * tokens.num_tokens, c.block_size)
        return (alone if fill == "vllm" else None), fill, True

    def chooser(self, strategy: str | None = None) -> FillChooser:
        """`fill="auto"`'s measurements for a strategy spec (each has its own costs)."""
        return self._choosers.setdefault(self.strategy(strategy), FillChooser())

    def _run_staged(
        self,
        tokens: TokenizedPrompt,
        params: GenerationParams,
        strategy: str | None,
        plan: StagePlan,
        on_token: Callable[[int], None] | None,
    ) -> tuple[Any, float, float, dict[str, Any]]:
        """A turn as a staged prefill (stages.py): one one-token request per stage but the
        last, then the turn's own request. `ttft_s` runs from the first stage's submission."""
        t0 = time.perf_counter()
        reports, computed = [], 0
        for stage in plan.stages[:-1]:
            sp = self._stage_params(tokens, stage)
            out, _, _ = self._run(tokens.ids[: stage.prompt_len], sp, None)
            reports.append(self.transfer_report(sp, out))
            computed += stage.prompt_len - int(out.num_cached_tokens or 0)
        sp = self.sampling_params(tokens, params, strategy, plan.stages[-1])
        out, ttft, wall = self._run(tokens.ids, sp, on_token, t0)
        reports.append(self.transfer_report(sp, out))
        computed += tokens.num_tokens - int(out.num_cached_tokens or 0)
        info: dict[str, Any] = {}
        for report in reports:
            merge_counts(info, report)
        info |= {"mode": "staged", "vllm_cached_tokens": reports[0].get("vllm_cached_tokens", 0)}
        info |= {"stages": len(plan.stages), "vllm_computed_tokens": computed}
        info |= {"planned_computed_tokens": plan.num_computed}
        self.last_transfer = info
        return out, ttft, wall, info

    def _stage_params(self, tokens: TokenizedPrompt, stage: Stage) -> Any:
        """A stage before the last: the prompt's first `stage.prompt_len` tokens, one token out
        (discarded), its run claimed, nothing stored (the last stage stores the turn)."""
        from vllm import SamplingParams

        spec = RequestSpec.from_prompt(tokens, None).clipped(stage.prompt_len)
        spec = replace(spec, stage=stage.claim or (0, 0), save=False)
        params = spec.with_report(uuid.uuid4().hex).to_params(self.scope_key)
        return SamplingParams(temperature=0.0, max_tokens=1,
                              extra_args={"kv_transfer_params": params})  # fmt: skip

    def report_strategy(self, strategy: str | None) -> str:
        """The strategy a turn's stats name: the connector's, or for the baselines the
        embedded strategy doing the same (`full`: no reuse; `prefix`: exact prefix blocks)."""
        if self.config.reuse == "agentcache":
            return self.strategy(strategy)
        return "full" if self.config.reuse == "none" else "prefix"

    def _run(
        self,
        ids: Sequence[int],
        sp: Any,
        on_token: Callable[[int], None] | None,
        t0: float | None = None,
    ) -> tuple[Any, float, float]:
        """Drive vLLM's engine until the request finishes; returns (final output, seconds to
        the first token, seconds in all), both from `t0` (default: now). A raising `on_token`
        (the client went away) aborts the request, so the engine is left clean for the next."""
        engine = self.llm.llm_engine
        rid = f"agentcache-{uuid.uuid4().hex}"
        t0 = time.perf_counter() if t0 is None else t0
        ttft: float | None = None
        sent = 0
        engine.add_request(rid, {"prompt_token_ids": list(ids)}, sp)
        try:
            while True:
                for out in engine.step():
                    if out.request_id != rid:
                        continue
                    got = out.outputs[0].token_ids  # cumulative
                    if ttft is None and len(got) > 0:
                        ttft = time.perf_counter() - t0
                    if on_token is not None:
                        for token in self._token_ids(got[sent:]):
                            on_token(token)
                    sent = len(got)
                    if out.finished:
                        wall = time.perf_counter() - t0
                        return out, ttft if ttft is not None else wall, wall
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM dropped request {rid} without finishing it")
        except BaseException:
            if engine.has_unfinished_requests():
                engine.abort_request([rid])
            raise

    def _token_ids(self, token_ids: Any) -> tuple[int, ...]:
        eos = self.tokenizer.eos_token_ids
        return tuple(int(t) for t in token_ids if int(t) not in eos)

    def transfer_report(self, sampling_params: Any, out: Any) -> dict[str, Any]:
        """What the connector did for a finished request: the scheduler's part (in its
        kv_transfer_params) and the worker's (its report file), merged."""
        info = dict((out.kv_transfer_params or {}).get("agentcache", {}))
        sent = (sampling_params.extra_args or {}).get("kv_transfer_params", {})
        report = sent.get("agentcache", {}).get("report")
        worker = read_report(Path(self.store_dir), report) if report else None
        if worker is not None:
            info |= worker.as_dict()
        # what the scheduler found (a refused segment spec, a span it declined to claim,
        # segments vLLM computed because the store lacked them) joins the worker's counts
        reasons = list(info.pop("scheduler_fallback_reasons", []))
        info["fallbacks"] = int(info.get("fallbacks", 0)) + len(reasons)
        info["fallback_reasons"] = [*info.get("fallback_reasons", []), *reasons]
        info["misses"] = [*info.get("misses", []), *info.pop("scheduler_misses", [])]
        self.last_transfer = info
        return info

    def _first_logits(self, logprobs: Any) -> torch.Tensor:
        """Log-probabilities of the first token's top `logprobs` candidates, -inf elsewhere."""
        out = torch.full((self.vocab_size,), float("-inf"))
        if logprobs:
            for tid, lp in logprobs[0].items():
                out[int(tid)] = float(lp.logprob)
        return out


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text before the first stop string, as the embedded engine returns it."""
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    return text if cut < 0 else text[:cut]


def _misses(raw: Any) -> tuple[SegmentMiss, ...]:
    """The connector's `[segment id, kind, tokens, reason]` lists as `SegmentMiss`es."""
    out = []
    for sid, kind, n, reason in raw:
        out.append(SegmentMiss(sid, str(kind), int(n), MissReason(reason)))
    return tuple(out)


def _config_value(folder: Path, key: str) -> Any:
    import json

    return json.loads((folder / "config.json").read_text(encoding="utf-8"))[key]
