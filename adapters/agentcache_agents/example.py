"""Shared command line of the example agents in examples/: model, strategy, threads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from agentcache import Engine, EngineConfig, load_model
from agentcache.model.loading import default_cache_dir
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache_agents.loop import AgentLoop
from agentcache_agents.report import summary_line, turn_table


def example_args(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=None, help="HF model folder (default: embedded SmolLM2)")
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, help="reuse strategy")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--cache-dir", type=Path, default=None, help="converted-model cache folder")
    return p.parse_args()


def example_engine(args: argparse.Namespace) -> Engine:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cache_dir = args.cache_dir or Path(
        os.environ.get("AGENTCACHE_CACHE_DIR") or default_cache_dir()
    )
    model = load_model(args.model, cache_dir)
    return Engine(model, EngineConfig(strategy=args.strategy))


def print_run(title: str, loop: AgentLoop, console: Console | None = None) -> None:
    console = console or Console(width=140)
    strategy = loop.session.strategy
    engine = loop.session.engine
    model = engine.model.model_id if isinstance(engine, Engine) else type(engine).__name__
    console.print(turn_table(f"{title} on {model} ({strategy})", loop.records))
    console.print(summary_line(loop))
