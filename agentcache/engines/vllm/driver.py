"""`StepDriver`: a turn's requests through vLLM's engine, step by step
(`LLMEngine.add_request` / `step`, what `LLM.generate` does inside), so each new token reaches
`on_token` as soon as vLLM returns it and the time to the first token is measured where it
happens; a staged prefill's chain of requests (stages.py); and `transfer_report`, what the
connector did for a finished request."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcache.engines.vllm.reports import merge_counts, read_report
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.stages import Stage, StagePlan
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import TurnCancelled


class StepDriver:
    """Drives `engine` (vLLM's `LLMEngine`); `eos_ids` are never passed to `on_token`. The
    connector's reports are read from `store_dir`; a stage's scopes are signed with
    `scope_key`."""

    def __init__(
        self, engine: Any, eos_ids: frozenset[int], store_dir: Path, scope_key: str
    ) -> None:
        self.engine = engine
        self.eos_ids = eos_ids
        self.store_dir = store_dir
        self.scope_key = scope_key

    def run(
        self,
        ids: Sequence[int],
        sp: Any,
        on_token: Callable[[int], None] | None,
        t0: float | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[Any, float, float]:
        """Drive vLLM's engine until the request finishes; returns (final output, seconds to
        the first token, seconds in all), both from `t0` (default: now). A raising `on_token`
        (the client went away) aborts the request, so the engine is left clean for the next;
        so does `cancel`, looked at before the request is added and before each engine step
        (`TurnCancelled`)."""
        engine = self.engine
        rid = f"agentcache-{uuid.uuid4().hex}"
        t0 = time.perf_counter() if t0 is None else t0
        ttft: float | None = None
        sent = 0
        _check(cancel)
        engine.add_request(rid, {"prompt_token_ids": list(ids)}, sp)
        try:
            while True:
                _check(cancel)
                for out in engine.step():
                    if out.request_id != rid:
                        continue
                    got = out.outputs[0].token_ids  # cumulative
                    if ttft is None and len(got) > 0:
                        ttft = time.perf_counter() - t0
                    if on_token is not None:
                        for token in self.token_ids(got[sent:]):
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

    def token_ids(self, token_ids: Any) -> tuple[int, ...]:
        """vLLM's output ids without end-of-sequence ids, as the embedded engine returns them."""
        return tuple(int(t) for t in token_ids if int(t) not in self.eos_ids)

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
        for stage in plan.stages[:-1]:
            sp = self._stage_params(tokens, stage)
            out, _, _ = self.run(tokens.ids[: stage.prompt_len], sp, None, cancel=cancel)
            reports.append(transfer_report(self.store_dir, sp, out))
            computed += stage.prompt_len - int(out.num_cached_tokens or 0)
        out, ttft, wall = self.run(tokens.ids, last, on_token, t0, cancel)
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


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise TurnCancelled("cancelled before vLLM's next engine step")


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
