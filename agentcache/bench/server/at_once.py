"""Concurrent turns on one engine, released together: what the batching benchmarks time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentcache.prompt.segments import SegmentedPrompt
from agentcache.runtime.engine import Engine, GenerationParams
from agentcache.runtime.stats import Generation


@dataclass(frozen=True)
class AtOnce:
    wall_s: float  # from the common release to the last reply
    ttft_s: list[float]  # each turn's first token, from the release
    generations: list[Generation]


def generate_at_once(
    engine: Engine,
    prompts: list[SegmentedPrompt],
    params: GenerationParams,
    strategy: str,
    commit: bool = False,
) -> AtOnce:
    """`engine.generate` of every prompt, each on its own thread, all released at once. A
    turn that raises makes the whole run raise its error, once every thread has ended."""
    n = len(prompts)
    start = threading.Barrier(n + 1)
    ttft: list[float] = [0.0] * n
    out: list[Generation | None] = [None] * n
    errors: list[BaseException] = []
    t0 = [0.0]

    def turn(i: int) -> None:
        def first(_: int) -> None:
            if not ttft[i]:
                ttft[i] = time.perf_counter() - t0[0]

        start.wait()
        try:
            out[i] = engine.generate(prompts[i], params, strategy, commit=commit, on_token=first)
        except BaseException as e:  # handed to the caller's thread below
            errors.append(e)

    threads = [threading.Thread(target=turn, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    t0[0] = time.perf_counter()
    start.wait()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0[0]
    if errors:
        raise errors[0]
    return AtOnce(wall, ttft, [g for g in out if g is not None])


def with_cpu_time(work: Callable[[], AtOnce]) -> tuple[AtOnce, float]:
    """`work()` and the process's CPU seconds it took (other jobs' load left out)."""
    cpu0 = time.process_time()
    got = work()
    return got, time.process_time() - cpu0
