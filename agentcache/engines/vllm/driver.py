"""`StepDriver`: a turn's requests through vLLM's engine, each submitted to the step loop
(loop.py: one thread steps the engine for every turn at once, as `LLM.generate` does inside),
so each new token reaches `on_token` as soon as vLLM returns it and the time to the first token
is measured where it happens; a staged prefill's chain of requests (stages.py), one after
another for the turn while other turns' requests batch beside them; and `transfer_report`,
what the connector did for a finished request."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcache.engines.vllm.loop import StepLoop
from agentcache.engines.vllm.reports import merge_counts, read_report
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.stages import Stage, StagePlan
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.prefix import chain_scope


def prompt_salt(tokens: TokenizedPrompt) -> str | None:
    """The `cache_salt` of a prompt's requests: its first segment's scope (`chain_scope`), so
    vLLM's prefix cache shares blocks where the store shares a prompt's prefix: within the
    scope the server gave it (a tenant's: nothing across tenants, not even a system prompt,
    and no block the connector filled approximately), by content where it has none."""
    return chain_scope(tokens)


class StepDriver:
    """Runs turns' requests on `engine` (vLLM's `LLMEngine`) through one `StepLoop`;
    `eos_ids` are never passed to `on_token`. The connector's reports are read from
    `store_dir`; a stage's scopes are signed with `scope_key`. Safe to call from many
    threads at once."""

    def __init__(
        self, engine: Any, eos_ids: frozenset[int], store_dir: Path, scope_key: str
    ) -> None:
        self.loop = StepLoop(engine, eos_ids)
        self.store_dir = store_dir
        self.scope_key = scope_key

    def run(
        self,
        ids: Sequence[int],
        sp: Any,
        on_token: Callable[[int], None] | None,
        t0: float | None = None,
        cancel: threading.Event | None = None,
        salt: str | None = None,
    ) -> tuple[Any, float, float]:
        """Run one request until it finishes, batched with the other turns' (`StepLoop.run`);
        returns (final output, seconds to the first token, seconds in all), both from `t0`
        (default: now). A raising `on_token` (the client went away) or a set `cancel`
        aborts the request before the engine's next step (`TurnCancelled` for `cancel`).
        `salt`: its `cache_salt` in vLLM's prefix cache (`prompt_salt`)."""
        done = self.loop.run(ids, sp, on_token, t0, cancel, salt)
        return done.output, done.ttft_s, done.wall_s

    def token_ids(self, token_ids: Any) -> tuple[int, ...]:
        """vLLM's output ids without end-of-sequence ids, as the embedded engine returns them."""
        return self.loop.token_ids(token_ids)

    def close(self) -> None:
        self.loop.close()

    def run_staged(
        self,
        tokens: TokenizedPrompt,
        plan: StagePlan,
        last: Any,
        on_token: Callable[[int], None] | None,
        cancel: threading.Event | None = None,
    ) -> tuple[Any, float, float, dict[str, Any]]:
        """A turn as a staged prefill (stages.py): one one-token request per stage but the
        last, then the turn's own request with sampling parameters `last`; returns what `run`
        does and the turn's merged transfer report. Time runs from the first submission.
        `cancel` stops it as it stops `run`, no stage started after it is set."""
        t0 = time.perf_counter()
        reports, computed = [], 0
        salt = prompt_salt(tokens)  # every stage's: each finds the blocks of the one before
        for stage in plan.stages[:-1]:
            sp = self._stage_params(tokens, stage)
            ids = tokens.ids[: stage.prompt_len]
            out, _, _ = self.run(ids, sp, None, cancel=cancel, salt=salt)
            reports.append(transfer_report(self.store_dir, sp, out))
            computed += stage.prompt_len - int(out.num_cached_tokens or 0)
        out, ttft, wall = self.run(tokens.ids, last, on_token, t0, cancel, salt)
        reports.append(transfer_report(self.store_dir, last, out))
        computed += tokens.num_tokens - int(out.num_cached_tokens or 0)
        info: dict[str, Any] = {}
        for report in reports:
            merge_counts(info, report)
        info |= {"mode": "staged", "vllm_cached_tokens": reports[0].get("vllm_cached_tokens", 0)}
        info |= {"stages": len(plan.stages), "vllm_computed_tokens": computed}
        info |= {"planned_computed_tokens": plan.num_computed}
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


def transfer_report(store_dir: Path, sampling_params: Any, out: Any) -> dict[str, Any]:
    """What the connector did for a finished request: the scheduler's part (in its
    kv_transfer_params) and the worker's (its report file in `store_dir`), merged."""
    info = dict((out.kv_transfer_params or {}).get("agentcache", {}))
    sent = (sampling_params.extra_args or {}).get("kv_transfer_params", {})
    report = sent.get("agentcache", {}).get("report")
    worker = read_report(store_dir, report) if report else None
    if worker is not None:
        info |= worker.as_dict()
    # what the scheduler found (a refused segment spec, a span it declined to claim,
    # segments vLLM computed because the store lacked them) joins the worker's counts
    reasons = list(info.pop("scheduler_fallback_reasons", []))
    info["fallbacks"] = int(info.get("fallbacks", 0)) + len(reasons)
    info["fallback_reasons"] = [*info.get("fallback_reasons", []), *reasons]
    info["misses"] = [*info.get("misses", []), *info.pop("scheduler_misses", [])]
    return info
