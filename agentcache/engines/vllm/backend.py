"""`VLLMBackend`: agentcache prompts executed by vLLM, with the same `generate` as `Engine`.

The prompt is tokenized segment by segment with agentcache's own rules (so segment ids, and
therefore store keys, are the ones the embedded engine uses), sent to vLLM as token ids, and
its segment spans travel in `kv_transfer_params` to the connector. Three reuse settings:

    agentcache  vLLM's prefix cache + agentcache's connector (segments, shared store)
    prefix      vLLM's prefix cache alone (the baseline)
    none        no reuse at all (the reference for fidelity)

This module is the facade: `FillDecider` (fill.py) decides who computes what reuse cannot
supply, `StepDriver` (driver.py) submits the turn's requests to one step loop (loop.py) that
runs every turn's requests in vLLM's engine at once (continuous batching), so each new token
reaches `on_token` as soon as vLLM returns it (streaming) and `ttft_s` is the time to the
first token.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from agentcache.engines.vllm import IN_PROCESS_ENV, require_vllm
from agentcache.engines.vllm.config import (
    ConnectorSettings,
    VLLMConfig,
    default_model_folder,
    kv_transfer_config,
)
from agentcache.engines.vllm.driver import StepDriver, prompt_salt, transfer_report
from agentcache.engines.vllm.families import require_folder_rerotation
from agentcache.engines.vllm.fill import FillDecider
from agentcache.engines.vllm.identity import model_identity, store_model_id
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.stages import (
    FillChooser,
    Stage,
    StagePlan,
)
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.errors import ConfigError
from agentcache.kv.store import MissReason, segment_content_id
from agentcache.model.families.base import hf_head_dim, hf_kv_heads
from agentcache.model.loading import DEFAULT_MODEL
from agentcache.model.tokenizer import HFTokenizer, chat_format_for
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt, tokenize_prompt
from agentcache.reuse import StrategySpec
from agentcache.reuse.base import SegmentMiss
from agentcache.reuse.selective import SelectiveRecompute
from agentcache.runtime.engine import Generation, GenerationParams, TurnStats
from agentcache.runtime.params import turn_params
from agentcache.runtime.stats import DecodePart, PrefillPart, ReplyKV, TokenReuse, TokenUse
from agentcache.runtime.stops import cut_at_stop
from agentcache.units import machine_memory_bytes


class VLLMBackend:
    """An execution engine with `Engine`'s session surface (`config.strategy`, `strategy()`,
    `tokenize()`, `generate()`), so `AgentSession` runs on it unchanged, and its serving
    surface (`tokenizer`, `max_context`, `model_id`, `store_bytes()`), so `agentcache serve`
    does. Turns may call `generate` from many threads at once: their requests batch in vLLM's
    engine (one thread steps it, loop.py); only the fill decision is taken under a lock.
    `close()` stops the step loop."""

    def __init__(self, config: VLLMConfig | None = None, cache_dir: Path | None = None) -> None:
        self.config = config or VLLMConfig()
        c = self.config
        vllm = require_vllm()
        from transformers import AutoTokenizer

        folder = Path(c.model) if c.model else default_model_folder(cache_dir)
        if c.reuse == "agentcache":  # segment reuse re-rotates keys: refused before vLLM loads
            require_folder_rerotation(folder)
        name = DEFAULT_MODEL if c.model is None else folder.name
        self.folder = folder
        self.tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder), name)
        self.chat_format = chat_format_for(self.tokenizer.vocab)
        self.vocab_size = int(_config_value(folder, "vocab_size"))
        check_kv_memory(folder, c)
        kwargs: dict[str, Any] = {
            "model": str(folder),
            "enforce_eager": True,
            "dtype": c.dtype,
            "max_model_len": c.max_model_len,
            # every prompt prefilled whole in one step (a staged prefill's stages rely on
            # it, and a turn computes what it computes alone); a step holds a whole prompt
            # beside a token of every running request (docs/vllm.md, "Batching")
            "enable_chunked_prefill": False,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_model_len + c.max_num_seqs,
            "block_size": c.block_size,
            "enable_prefix_caching": c.reuse != "none",
            "kv_cache_memory_bytes": c.kv_cache_bytes,
            "gpu_memory_utilization": 0.1,  # on CPU: the share of RAM checked at start-up
            "disable_log_stats": True,
        }
        self.store_dir = c.store_dir or ConnectorSettings().store_dir
        self.scope_key = secrets.token_hex(16)  # signs the scopes this backend issues
        # what the server's retention pins (a turn's segments across a tool pause): the
        # shared folder, bounded as the connector bounds it; its pins every process honours
        self.retention_store: FolderSegmentStore | None = None
        if c.reuse == "agentcache":
            settings = ConnectorSettings(
                store_dir=self.store_dir,
                store_bytes=c.store_bytes,
                folder_bytes=c.folder_bytes,
                strategy=c.strategy,
                model_name=name,
                min_reused_fraction=c.min_reused_fraction,
                fill=c.fill,
                scope_key=self.scope_key,
            )
            kwargs["kv_transfer_config"] = kv_transfer_config(settings)
            self.retention_store = FolderSegmentStore(
                Path(self.store_dir), 0, folder_bytes=settings.folder_bytes
            )
        if c.in_process:
            _check_in_process()
        self.llm = vllm.LLM(**kwargs)
        self.driver = StepDriver(
            self.llm.llm_engine, self.tokenizer.eos_token_ids, Path(self.store_dir), self.scope_key
        )
        ident = model_identity(folder, name)
        self.model_id = ident.model_id
        store_ids = (store_model_id(ident.model_id, getattr(torch, c.dtype)), ident.tokenizer_id)
        # the store as a staged prefill plans from it: metadata only, no KV held here
        self.decider = FillDecider(c, FolderSegmentStore(Path(self.store_dir), 0), store_ids)
        self._store_ids = store_ids
        self.last_transfer: dict[str, Any] = {}  # the connector's report on the latest turn
        self._decide_lock = threading.Lock()  # the fill decision's state (FillDecider)
        self._preemptions = 0
        self._count_lock = threading.Lock()

    @property
    def max_active(self) -> int:
        """Requests vLLM runs at once, `max_num_seqs` (`agentcache serve --backend vllm`'s
        default `--max-active`; how many fit is bounded by tokens, `kv_tokens`)."""
        return self.config.max_num_seqs

    @property
    def kv_tokens(self) -> int | None:
        """Tokens vLLM's KV cache holds (its blocks times `block_size`; None before it is
        known): `agentcache serve --backend vllm`'s default `--max-active-tokens`, so the
        server admits what fits and vLLM seldom preempts (it can: tests/engines/test_vllm_batch)."""
        blocks = self.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        return int(blocks) * self.config.block_size if blocks else None

    @property
    def prefix_block_tokens(self) -> int | None:
        """Tokens per block of vLLM's prefix cache (`block_size`), where it shares the blocks of
        a prompt prefix between requests; None without prefix caching. `agentcache serve`
        counts such blocks once among the active requests' reserves (`server/admission.py`)."""
        return self.config.block_size if self.config.reuse != "none" else None

    @property
    def preemptions(self) -> int:
        """Times vLLM preempted the requests of the turns finished so far (their blocks freed,
        their tokens computed again on resume), as the connector counted them: a turn's count
        reaches this when it finishes (a staged turn's over its requests; a cancelled turn's
        not at all), and its own is in `last_transfer["preemptions"]`."""
        with self._count_lock:
            return self._preemptions

    def close(self) -> None:
        """Stop the step loop; turns still running fail, later ones raise."""
        self.driver.close()

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
        built = self.decider.selective(strategy)
        return built if built is not None and built.up_front else None

    def stage_plan(self, tokens: TokenizedPrompt, strategy: SelectiveRecompute) -> StagePlan:
        """Which tokens vLLM computes, and in which requests, from what the store holds now."""
        return self.decider.stage_plan(tokens, strategy)

    def chooser(self, strategy: str | None = None) -> FillChooser:
        """`fill="auto"`'s measurements for a strategy spec (each has its own costs)."""
        return self.decider.chooser(strategy)

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
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Run one turn on vLLM. `on_token` gets each new token id as vLLM's engine step returns
        it (end-of-sequence ids excluded, as the embedded engine does); `ttft_s` is the time from
        submitting the request to its first token. A reply's KV is not stored (`reply_kv`).
        `cancel` aborts the request before vLLM's next engine step (`StepLoop`); a turn
        cancelled before its request is added never reaches the engine. Turns from several
        threads run in vLLM's engine at once."""
        if not commit:
            raise ValueError("the vLLM backend always stores a turn's segments (commit=False)")
        params = turn_params(params, reply)
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        with self._decide_lock:
            decision = self.decider.decide(tokens, strategy)
        plan, fill, chosen = decision.plan, decision.fill, decision.chosen
        uses: TokenReuse | None = None  # where each token's KV came from, where known
        if fill == "engine":
            floor = 0.0 if chosen else None  # chosen on measurements: no share threshold
            sp = self.sampling_params(tokens, params, strategy, min_reused=floor)
            out, ttft, wall = self.driver.run(
                tokens.ids, sp, on_token, cancel=cancel, salt=prompt_salt(tokens)
            )
            info = self.transfer_report(sp, out)
            # vLLM computed what it had not cached (its prefix cache + the connector's
            # span); the connector's engine computed `computed_tokens` more (the last
            # token counted twice)
            computed = tokens.num_tokens - int(out.num_cached_tokens or 0)
            computed = min(tokens.num_tokens, computed + int(info.get("computed_tokens", 0)))
            uses = filled_token_reuse(tokens.num_tokens, info, int(out.num_cached_tokens or 0))
        else:
            assert plan is not None
            last = self.sampling_params(tokens, params, strategy, plan.stages[-1])
            out, ttft, wall, info = self.driver.run_staged(tokens, plan, last, on_token, cancel)
            self.last_transfer = info
            computed = int(info["vllm_computed_tokens"])
            uses = plan.token_reuse(int(info.get("vllm_cached_tokens", 0)), computed)
            if uses is not None:  # a segment the store lacked and vLLM computed whole: new
                news = [
                    [s.segment.id, str(s.kind), s.end - s.start, "new"]
                    for s in decision.unstored  # read when the plan was made
                    if s.end > s.start
                    and uses.count(TokenUse.COMPUTED, s.start, s.end) == s.end - s.start
                ]
                info["misses"] = [*info.get("misses", []), *news]
        if chosen:  # the cost per token the chooser learns counts the engine's last token too
            with self._decide_lock:
                self.chooser(strategy).observe(fill, ttft * 1e3, computed)
        if uses is not None:  # per token: computed by vLLM or the engine, once
            computed = uses.count(TokenUse.COMPUTED)
        with self._count_lock:
            self._preemptions += int(info.get("preemptions", 0))
        info["fill"] = fill
        comp = out.outputs[0]
        ids = self.driver.token_ids(comp.token_ids)[: params.max_new_tokens]
        finish = "stop" if comp.finish_reason == "stop" else "length"
        decode_s = wall - ttft
        prefill = PrefillPart(
            strategy=self.report_strategy(strategy), prompt_tokens=tokens.num_tokens,
            reused_tokens=tokens.num_tokens - computed, recomputed_tokens=computed,
            recompute_fraction=computed / max(1, tokens.num_tokens), ttft_s=ttft,
            fallbacks=int(info.get("fallbacks", 0)),
            fallback_reasons=tuple(info.get("fallback_reasons", ())),
            misses=_misses(info.get("misses", ())), token_reuse=uses,
            exact_tokens=_count(uses, TokenUse.EXACT), moved_tokens=_count(uses, TokenUse.MOVED),
            refreshed_tokens=_count(uses, TokenUse.REFRESHED),
            computed_tokens=_count(uses, TokenUse.COMPUTED),
        )  # fmt: skip
        rate = (len(ids) - 1) / decode_s if len(ids) > 1 and decode_s > 0 else 0.0
        stats = TurnStats.of(
            prefill=prefill,
            decode=DecodePart(decode_tokens=len(ids), decode_tokens_per_s=rate),
            reply_kv=None if reply is None else ReplyKV.BACKEND,
        )
        text = cut_at_stop(self.tokenizer.decode(ids), params.stop)
        return Generation(text, ids, finish, self._first_logits(comp.logprobs), stats)

    def retained_ids(
        self, tokens: TokenizedPrompt, reply_segment: Segment | None = None
    ) -> tuple[str, str, list[str]]:
        """The store's model and tokenizer ids, and the content ids the connector stores a
        turn of `tokens` under: each segment's, scope included (a reply's KV is not stored,
        and prefix blocks, unscoped, are not retained)."""
        model_id, tokenizer_id = self._store_ids
        return (
            model_id,
            tokenizer_id,
            [segment_content_id(s.ids, s.segment.scope) for s in tokens.segments],
        )

    def report_strategy(self, strategy: str | None) -> str:
        """The strategy a turn's stats name: the connector's, or for the baselines the
        embedded strategy doing the same (`full`: no reuse; `prefix`: exact prefix blocks)."""
        if self.config.reuse == "agentcache":
            return self.strategy(strategy)
        return "full" if self.config.reuse == "none" else "prefix"

    def transfer_report(self, sampling_params: Any, out: Any) -> dict[str, Any]:
        """What the connector did for a finished request (`driver.transfer_report`)."""
        self.last_transfer = transfer_report(Path(self.store_dir), sampling_params, out)
        return self.last_transfer

    def _first_logits(self, logprobs: Any) -> torch.Tensor:
        """Log-probabilities of the first token's top `logprobs` candidates, -inf elsewhere."""
        out = torch.full((self.vocab_size,), float("-inf"))
        if logprobs:
            for tid, lp in logprobs[0].items():
                out[int(tid)] = float(lp.logprob)
        return out


def _check_in_process() -> None:
    """vLLM runs its engine core in the caller's process only when the environment says so
    (read by vLLM when the engine starts); the entry point sets it, never the library."""
    import vllm.envs

    if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        raise ConfigError(
            f"in_process=True needs {IN_PROCESS_ENV}=0 in the environment before vLLM starts "
            "(agentcache's CLI sets it; a script sets it before creating the backend), or "
            "VLLMConfig(in_process=False) to let vLLM spawn its engine core"
        )


def filled_token_reuse(n: int, info: dict[str, Any], cached: int) -> TokenReuse | None:
    """Where each prompt token's KV came from in a turn vLLM ran whole (fill "engine"):
    vLLM's own hit [0, h) exact, the span the connector filled as the worker's `token_runs`
    say (the strategy's masks), the rest computed by vLLM. None where that is not known (a
    claim without runs, runs that do not tile the claim up to vLLM's `cached` count: a
    request preempted and claimed again)."""
    hit = int(info.get("vllm_cached_tokens", cached))
    runs = info.get("token_runs") or []
    if bool(info.get("planned_tokens")) != bool(runs) or not 0 <= hit <= n:
        return None
    reused, exact, dirty = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
    reused[:hit] = exact[:hit] = True
    at = hit
    try:
        for start, end, name in runs:
            use = TokenUse(name)
            if start != at or not start < end <= n:
                return None
            reused[start:end] = use != TokenUse.COMPUTED
            exact[start:end] = use == TokenUse.EXACT
            dirty[start:end] = use == TokenUse.REFRESHED
            at = end
    except (TypeError, ValueError):  # a report this connector does not write
        return None
    return TokenReuse.of(n, reused, exact, dirty) if at == cached else None


def _count(uses: TokenReuse | None, use: TokenUse) -> int | None:
    return None if uses is None else uses.count(use)


def _misses(raw: Any) -> tuple[SegmentMiss, ...]:
    """The connector's `[segment id, kind, tokens, reason]` lists as `SegmentMiss`es."""
    out = []
    for sid, kind, n, reason in raw:
        out.append(SegmentMiss(sid, str(kind), int(n), MissReason(reason)))
    return tuple(out)


def kv_bytes_per_token(folder: Path, dtype: str) -> int:
    """Bytes of K and V one token takes in vLLM's paged memory for the model in `folder`."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(folder)
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * hf.num_hidden_layers * hf_kv_heads(hf) * hf_head_dim(hf) * size


def check_kv_memory(folder: Path, config: VLLMConfig) -> None:
    """`ConfigError` before vLLM loads when its KV memory (`kv_cache_bytes`, the server's
    `--kv-bytes`) cannot hold one sequence of `max_model_len` tokens and the block vLLM keeps
    beside it (vLLM 0.32 refuses less at start-up), naming both sizes."""
    memory = kv_device_memory()
    if memory is not None and config.kv_cache_bytes > memory:
        raise ConfigError(
            f"vLLM's KV memory of {config.kv_cache_bytes} bytes (--kv-bytes, "
            f"VLLMConfig.kv_cache_bytes) exceeds the {memory} bytes of the memory it would "
            "live in (the GPU's, else this machine's): give it less"
        )
    per_token = kv_bytes_per_token(folder, config.dtype)
    block = config.block_size
    tokens = config.kv_cache_bytes // per_token // block * block
    if tokens < config.max_model_len + block:
        need = (-(-config.max_model_len // block) + 1) * block * per_token
        raise ConfigError(
            f"vLLM's KV memory of {config.kv_cache_bytes} bytes (--kv-bytes, "
            f"VLLMConfig.kv_cache_bytes) holds {tokens} "
            f"tokens of this model ({per_token} bytes each), fewer than --max-model-len "
            f"{config.max_model_len}: give it at least {need} bytes or lower --max-model-len"
        )


def kv_device_memory() -> int | None:
    """The memory vLLM's KV cache lives in: the first GPU's where torch sees one, else this
    machine's (vLLM's CPU backend); None where neither is known."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return machine_memory_bytes()


def _config_value(folder: Path, key: str) -> Any:
    import json

    return json.loads((folder / "config.json").read_text(encoding="utf-8"))[key]
