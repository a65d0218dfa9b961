"""`VLLMBackend`: agentcache prompts executed by vLLM, with the same `generate` as `Engine`.

The prompt is tokenized segment by segment with agentcache's own rules (so segment ids, and
therefore store keys, are the ones the embedded engine uses), sent to vLLM as token ids, and
its segment spans travel in `kv_transfer_params` to the connector. Three reuse settings:

    agentcache  vLLM's prefix cache + agentcache's connector (segments, shared store)
    prefix      vLLM's prefix cache alone (the baseline)
    none        no reuse at all (the reference for fidelity)
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.engines.vllm import require_vllm
from agentcache.engines.vllm.config import (
    ConnectorSettings,
    default_model_folder,
    kv_transfer_config,
)
from agentcache.engines.vllm.plan import RequestSpec
from agentcache.engines.vllm.storage import read_report
from agentcache.model.loading import DEFAULT_MODEL
from agentcache.model.tokenizer import HFTokenizer, chat_format_for
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.prompt.tokenize import TokenizedPrompt, tokenize_prompt
from agentcache.reuse import DEFAULT_STRATEGY, STRATEGIES
from agentcache.runtime.engine import Generation, GenerationParams, TurnStats

REUSE_MODES = ("agentcache", "prefix", "none")
GiB = 1 << 30


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

    def __post_init__(self) -> None:
        if self.reuse not in REUSE_MODES:
            raise ValueError(f"reuse must be one of {REUSE_MODES}, got {self.reuse!r}")
        STRATEGIES.get(self.strategy)

    @property
    def strategy_name(self) -> str:
        return self.strategy


class VLLMBackend:
    """An execution engine with `Engine`'s session surface (`config.strategy`, `strategy()`,
    `tokenize()`, `generate()`), so `AgentSession` runs on it unchanged."""

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
        if c.reuse == "agentcache":
            settings = ConnectorSettings(
                store_dir=self.store_dir,
                store_bytes=c.store_bytes,
                strategy=c.strategy,
                model_name=name,
                min_reused_fraction=c.min_reused_fraction,
            )
            kwargs["kv_transfer_config"] = kv_transfer_config(settings)
        if c.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.llm = vllm.LLM(**kwargs)
        self.last_transfer: dict[str, Any] = {}  # the connector's report on the latest turn

    def strategy(self, name: str | None = None) -> str:
        """Validate a strategy name (unknown names list the known ones)."""
        name = name or self.config.strategy
        STRATEGIES.get(name)
        return name

    def tokenize(self, prompt: SegmentedPrompt) -> TokenizedPrompt:
        return tokenize_prompt(prompt, self.tokenizer, self.chat_format, self.config.max_model_len)

    def sampling_params(
        self, tokens: TokenizedPrompt, params: GenerationParams, strategy: str | None
    ) -> Any:
        from vllm import SamplingParams

        extra: dict[str, Any] = {}
        if self.config.reuse == "agentcache":
            spec = RequestSpec.from_prompt(tokens, self.strategy(strategy))
            extra["kv_transfer_params"] = spec.with_report(uuid.uuid4().hex).to_params()
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
    ) -> Generation:
        """Run one turn on vLLM. `ttft_s` in the stats is the wall time of a one-token call
        only when `max_new_tokens` is 1; otherwise it is the whole call (vLLM's offline API
        reports no first-token time)."""
        if not commit:
            raise ValueError("the vLLM backend always stores a turn's segments (commit=False)")
        params = params or GenerationParams()
        tokens = prompt if isinstance(prompt, TokenizedPrompt) else self.tokenize(prompt)
        sp = self.sampling_params(tokens, params, strategy)
        t0 = time.perf_counter()
        out = self.llm.generate({"prompt_token_ids": list(tokens.ids)}, sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        comp = out.outputs[0]
        ids = tuple(int(t) for t in comp.token_ids if int(t) not in self.tokenizer.eos_token_ids)
        finish = "stop" if comp.finish_reason == "stop" else "length"
        info = self.transfer_report(sp, out)
        # vLLM computed what it had not cached (its prefix cache + the connector's span); the
        # connector's engine computed `computed_tokens` more (the last token counted twice)
        cached = int(out.num_cached_tokens or 0)
        computed = min(
            tokens.num_tokens, tokens.num_tokens - cached + int(info.get("computed_tokens", 0))
        )
        stats = TurnStats(
            self.config.reuse if self.config.reuse != "agentcache" else self.strategy(strategy),
            tokens.num_tokens, tokens.num_tokens - computed, computed,
            computed / max(1, tokens.num_tokens), wall, len(ids),
            len(ids) / wall if wall > 0 else 0.0, int(info.get("fallbacks", 0)),
            tuple(info.get("fallback_reasons", ())), (),
        )  # fmt: skip
        return Generation(
            self.tokenizer.decode(ids), ids, finish, self._first_logits(comp.logprobs), stats
        )

    def transfer_report(self, sampling_params: Any, out: Any) -> dict[str, Any]:
        """What the connector did for a finished request: the scheduler's part (in its
        kv_transfer_params) and the worker's (its report file), merged."""
        info = dict((out.kv_transfer_params or {}).get("agentcache", {}))
        sent = (sampling_params.extra_args or {}).get("kv_transfer_params", {})
        report = sent.get("agentcache", {}).get("report")
        if report:
            info |= read_report(Path(self.store_dir), report)
        self.last_transfer = info
        return info

    def _first_logits(self, logprobs: Any) -> torch.Tensor:
        """Log-probabilities of the first token's top `logprobs` candidates, -inf elsewhere."""
        out = torch.full((self.vocab_size,), float("-inf"))
        if logprobs:
            for tid, lp in logprobs[0].items():
                out[int(tid)] = float(lp.logprob)
        return out


def _config_value(folder: Path, key: str) -> Any:
    import json

    return json.loads((folder / "config.json").read_text(encoding="utf-8"))[key]
