"""Where a turn's time goes on vLLM + agentcache's connector (run in the vLLM venv).

    .venv-vllm/bin/python benchmarks/vllm_ttft_profile.py CONFIG [SESSION] [TURNS]

CONFIG is `prefix` (vLLM's prefix cache alone) or `agentcache:STRATEGY`. The session's turns
run one by one, one token each, in one vLLM engine (in this process); the connector's and the
filler's steps are timed by wrapping their methods, so the breakdown adds up to the turn's
TTFT: scheduler claim, segment fill (store reads, the strategy's forward passes, the page
writes), the rest of vLLM's step (its forward over what it computes, sampling, scheduling)
and the segment save after the forward. Prints one JSON line per turn after `PROFILE `.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMES: dict[str, float] = defaultdict(float)
MS = ("claim", "fill", "save", "vllm_step")  # seconds -> ms in the output


def timed(owner: Any, name: str, label: str) -> None:
    """Accumulate the wall time of `owner.name` calls under `label`."""
    fn: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def _ms(label: str, value: float) -> float:
    return round(value * 1e3, 1) if "." in label or label in MS else value


def instrument() -> None:
    import torch
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from agentcache.engines.vllm import connector, storage, transfer
    from agentcache.kv.pool import SequenceKV
    from agentcache.model.llama import LlamaForward
    from agentcache.reuse import selective

    timed(CPUModelRunner, "execute_model", "vllm_step")
    C = connector.AgentCacheConnector
    timed(C, "get_num_new_matched_tokens", "claim")
    timed(C, "start_load_kv", "fill")
    timed(C, "wait_for_save", "save")
    timed(C, "_segment_filler", "fill.model_load")
    timed(transfer.SegmentFiller, "fill", "fill.filler")
    timed(transfer.PagedKV, "write", "fill.page_write")
    timed(transfer.PagedKV, "read", "save.page_read")
    timed(storage.FolderSegmentStore, "_read", "store.file_read")
    timed(storage.FolderSegmentStore, "_write", "store.file_write")
    timed(selective.SelectiveRecompute, "prefill", "fill.strategy")
    timed(selective, "find_hits", "fill.strategy.lookup")
    timed(selective.DirectKV, "load_all", "fill.strategy.rerotate")
    timed(selective._Run, "layers", "fill.strategy.forward")
    timed(selective._Run, "_probed", "fill.strategy.forward.probe")
    timed(SequenceKV, "gather_all", "fill.gather")
    timed(LlamaForward, "project", "fill.op.project")  # norm + QKV + RoPE
    timed(LlamaForward, "attend", "fill.op.attend")  # attention + o_proj + MLP
    timed(selective.DirectKV, "gather", "fill.op.kv_gather")
    timed(selective.DirectKV, "write", "fill.op.kv_write")

    def threads(self: Any, *args: Any, **kwargs: Any) -> Any:
        TIMES["threads_in_fill"] = torch.get_num_threads()
        return fill(self, *args, **kwargs)

    fill = transfer.SegmentFiller.fill
    transfer.SegmentFiller.fill = threads  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in here
    config = argv[0]
    session_name = argv[1] if len(argv) > 1 else "reflexion-01"
    max_turns = int(argv[2]) if len(argv) > 2 else 3
    from agentcache.bench.workload import load_workload
    from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
    from agentcache.runtime.engine import GenerationParams

    workload = session_name.rsplit("-", 1)[0]
    sessions = load_workload(Path(f"benchmarks/workloads/{workload}.jsonl")).sessions
    session = next(s for s in sessions if s.name == session_name)
    reuse, _, strategy = config.partition(":")
    instrument()
    options: dict[str, Any] = {"reuse": reuse, "store_dir": tempfile.mkdtemp(), "logprobs": 5}
    if strategy:
        options["strategy"] = strategy
    backend = VLLMBackend(VLLMConfig(**options))
    for ti, turn in enumerate(session.turns[:max_turns]):
        TIMES.clear()
        g = backend.generate(turn.prompt, GenerationParams(max_new_tokens=1))
        info = backend.last_transfer
        row = {
            "config": config, "turn": ti, "prompt_tokens": g.stats.prompt_tokens,
            "ttft_ms": round(g.stats.ttft_s * 1e3, 1),
            "vllm_cached": info.get("vllm_cached_tokens"), "claimed": info.get("claimed_tokens"),
            "engine_computed": info.get("computed_tokens"), "first_token": g.token_ids[:1],
            **{k: _ms(k, v) for k, v in sorted(TIMES.items())},
        }  # fmt: skip
        print("PROFILE " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
