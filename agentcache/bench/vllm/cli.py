"""`agentcache bench --backend vllm`: progress and the summary table."""

from __future__ import annotations

import argparse

from rich.console import Console

from agentcache.engines.vllm import require_vllm
from agentcache.engines.vllm.config import FILL_MODES
from agentcache.engines.vllm.stages import staged_strategy
from agentcache.errors import ConfigError
from agentcache.progress import progress_bar
from agentcache.reuse import DEFAULT_STRATEGY, StrategySpec
from agentcache.workload.files import Session

BASELINES = ("full", "prefix")  # measured by vLLM itself (no reuse / prefix caching)


def vllm_strategies(text: str, default_list: bool) -> list[str]:
    """The connector configurations to measure: `spec` or `spec@fill` (a FILL_MODES entry:
    who computes what reuse cannot supply; auto by default), `default` unless named. The
    baselines are vLLM's own runs."""
    if default_list:
        return [DEFAULT_STRATEGY]
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        spec, _, fill = item.partition("@")
        spec = DEFAULT_STRATEGY if spec == "default" else spec
        if spec in BASELINES:
            continue
        parsed = StrategySpec.parse(spec)  # a clear error now, not in an engine process
        if fill and fill not in FILL_MODES:
            raise ConfigError(f"{item!r}: the fill after @ is one of {', '.join(FILL_MODES)}")
        if fill == "vllm":  # staged prefills need strategies that choose tokens up front
            staged_strategy(parsed)
        out.append(spec if fill in ("", "auto") else f"{spec}@{fill}")
    return out or [DEFAULT_STRATEGY]


def run_vllm(
    args: argparse.Namespace, strategies: list[str], sessions: list[Session], console: Console
) -> int:
    """Measure `strategies` (from `vllm_strategies`) on `sessions`, `args.rounds` times."""
    from agentcache.bench.vllm.report import report_head
    from agentcache.bench.vllm.run import bench_configs, run_all

    require_vllm()  # a clear error before anything starts
    total = len(bench_configs(strategies)) * sum(len(s.turns) for s in sessions) * args.rounds
    with progress_bar(console) as progress:
        task = progress.add_task("vLLM bench", total=total)
        results = run_all(
            sessions,
            strategies,
            args.out,
            lambda d: progress.update(task, advance=1, description=d),
            args.threads,  # the engine processes' OpenMP threads (docs/vllm.md, TTFT)
            resume=args.resume,
            rounds=args.rounds,
        )
    print(report_head(results))
    print(f"\nwrote {args.out}/results.json, report.md and ttft.png")
    return 0
