"""`agentcache bench --backend vllm`: progress and the summary table."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentcache.bench.workload import Session
from agentcache.engines.vllm import require_vllm
from agentcache.engines.vllm.config import FILL_MODES
from agentcache.reuse import DEFAULT_STRATEGY, StrategySpec

BASELINES = ("full", "prefix")  # measured by vLLM itself (no reuse / prefix caching)


def vllm_strategies(text: str, default_list: bool) -> list[str]:
    """The connector strategies to measure (`name` or `name:key=value...`): `default` unless
    named. The baselines are vLLM's own runs."""
    if default_list:
        return [DEFAULT_STRATEGY]
    names = [DEFAULT_STRATEGY if t == "default" else t for t in text.split(",") if t.strip()]
    for name in names:
        StrategySpec.parse(name)  # a clear error now, not in an engine process
    return [n for n in names if n not in BASELINES] or [DEFAULT_STRATEGY]


def vllm_fills(text: str) -> list[str]:
    """`--vllm-fill`: a comma list of FILL_MODES; each strategy runs under each."""
    fills = [f.strip() for f in text.split(",") if f.strip()]
    for fill in fills:
        if fill not in FILL_MODES:
            raise ValueError(f"--vllm-fill takes {', '.join(FILL_MODES)}, got {fill!r}")
    return fills or ["auto"]


def run_vllm(args: argparse.Namespace, sessions: list[Session], console: Console) -> int:
    from agentcache.bench.cli import ALL
    from agentcache.engines.vllm.bench import _configs, report_markdown, run_all

    require_vllm()  # a clear error before anything starts
    strategies = vllm_strategies(args.strategies, args.strategies == ALL)
    fills = vllm_fills(args.vllm_fill)
    total = len(_configs(strategies, fills)) * sum(len(s.turns) for s in sessions)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    ) as progress:  # fmt: skip
        task = progress.add_task("vLLM bench", total=total)
        results = run_all(
            sessions,
            strategies,
            args.out,
            lambda d: progress.update(task, advance=1, description=d),
            args.threads,  # the engine processes' OpenMP threads (docs/vllm.md, TTFT)
            fills,
        )
    print(report_markdown({"configs": results["configs"], "records": []}).split("\n\n")[0])
    print(f"\nwrote {args.out}/results.json, report.md and ttft_per_turn.png")
    return 0
