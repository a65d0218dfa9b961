"""`agentcache bench-dense-decode`: the engine's dense decode against `transformers`' generate.

Per context and prompt, all from one prefill and the same prompt tokens, greedy, `new_tokens`
tokens each (end of text does not stop them):

- `engine`: `Engine.step`, the page pool read in place (`decode.dense.dense_step`);
- `gather`: the reference path (`reference_step`), which copies the context at every layer of
  every step, as the engine's dense decode did before;
- `transformers`: `generate` of the same weights with its default cache (a fresh prefill).

tokens/s counts the steps after the first generated token (its logits come from the prefill):
for `transformers` the time between the logits-processor calls of the first and the last
token. Ratios are taken per prompt within the run, then the median over prompts.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentcache.bench.decode.bench import PAGE, Run, pool_run
from agentcache.decode.dense import reference_step
from agentcache.model.loading import LoadedModel
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Engine, EngineConfig

PATHS = ("engine", "gather", "transformers")


@dataclass(frozen=True)
class DenseBenchSettings:
    contexts: tuple[int, ...] = (1024, 4096, 8192)  # prompt + new tokens
    new_tokens: int = 64
    num_prompts: int = 2

    def __post_init__(self) -> None:
        if self.new_tokens < 2:
            raise ValueError(f"need new_tokens >= 2 to time a decode step, got {self.new_tokens}")
        if not self.contexts or min(self.contexts) <= self.new_tokens:
            raise ValueError(
                f"every context must exceed new_tokens ({self.new_tokens}); got {self.contexts}"
            )


def run_dense_bench(
    model: LoadedModel,
    hf_model: Any,
    prompts: dict[int, list[TokenizedPrompt]],
    settings: DenseBenchSettings,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per-context summaries and per-prompt records (module doc); `prompts` by context."""
    engine = Engine(model, EngineConfig(strategy="full", kv_pages=2 + max(prompts) // PAGE))
    out: dict[str, Any] = {}
    for context, group in prompts.items():
        records = [_prompt(engine, hf_model, p, settings.new_tokens, on_step) for p in group]
        out[str(context)] = {"summary": _summary(records), "per_prompt": records}
    return out


def _prompt(
    engine: Engine,
    hf_model: Any,
    prompt: TokenizedPrompt,
    n: int,
    on_step: Callable[[str], None] | None,
) -> dict[str, Any]:
    seq, pre = engine.prefill(prompt)
    try:
        keys, values = seq.gather_all(slice(0, seq.num_tokens))
    finally:
        seq.free()
    first, start = int(pre.logits.argmax()), int(pre.positions.max()) + 1
    forward = engine.model.forward
    steps = {
        "engine": engine.step,
        "gather": lambda s, tok, pos: reference_step(forward, s, tok, pos),
    }
    runs = {name: pool_run(engine, step, keys, values, (first, start, n), on_step)
            for name, step in steps.items()}  # fmt: skip
    runs["transformers"] = hf_generate(hf_model, list(prompt.ids), n)
    if on_step:
        for _ in range(n - 1):
            on_step("transformers")
    rec: dict[str, Any] = {"prompt_tokens": prompt.num_tokens}
    for name, run in runs.items():
        agree = sum(a == b for a, b in zip(run.tokens, runs["engine"].tokens, strict=True))
        rec[name] = {
            "tokens_per_s": (n - 1) / sum(run.step_s),
            "greedy_agreement_with_engine": agree / n,
            "tokens": run.tokens,
        }
    return rec


def hf_generate(hf_model: Any, ids: list[int], n: int) -> Run:
    """Greedy `generate` of exactly n tokens; step_s holds the gaps between token decisions."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):  # called once per generated token, after its forward
        def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([ids])
    with torch.inference_mode():
        out = hf_model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
            do_sample=False, logits_processor=LogitsProcessorList([Stamp()]), pad_token_id=0,
        )  # fmt: skip
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return Run(out[0, len(ids) :].tolist(), gaps, 0.0, None, 0, 0)


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    out: dict[str, Any] = {}
    for name in PATHS:
        speeds = [r[name]["tokens_per_s"] for r in records]
        ratios = [r["engine"]["tokens_per_s"] / r[name]["tokens_per_s"] for r in records]
        out[name] = {
            "tokens_per_s_median": median(speeds),
            "tokens_per_s_min": min(speeds),
            "tokens_per_s_max": max(speeds),
            "engine_speedup_median": median(ratios),
            "engine_speedup_min": min(ratios),
            "greedy_agreement_with_engine": median(
                [r[name]["greedy_agreement_with_engine"] for r in records]
            ),
        }
    return out
