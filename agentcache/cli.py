"""`agentcache` command line. Environment variables are read here and nowhere else."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentcache.argtypes import (
    end_outputs,
    non_negative_int,
    path_text,
    positive_int,
    thread_count,
)
from agentcache.engines.vllm import IN_PROCESS_ENV  # no vLLM import
from agentcache.errors import AgentCacheError, ConfigError


def _threads(value: int | None) -> None:
    import torch

    env = os.environ.get("AGENTCACHE_NUM_THREADS", "").strip()
    if value is None and env:
        try:
            value = thread_count(env)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"AGENTCACHE_NUM_THREADS {e}") from None
    torch.set_num_threads(value or os.cpu_count() or 1)


def _cache_dir(value: str | None) -> Path:
    from agentcache.model.loading import default_cache_dir

    return Path(value or os.environ.get("AGENTCACHE_CACHE_DIR") or default_cache_dir())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=path_text, default=None,
                   help="model folder (default: embedded SmolLM2-135M)")  # fmt: skip
    p.add_argument("--cache-dir", type=path_text, default=None,
                   help="cache folder (env AGENTCACHE_CACHE_DIR)")  # fmt: skip
    p.add_argument(
        "--threads", type=thread_count, default=None,
        help="torch threads (env AGENTCACHE_NUM_THREADS; default or 0: all cores)",
    )  # fmt: skip


def cmd_demo(args: argparse.Namespace) -> int:
    from agentcache.demo import run_demo

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    return run_demo(args.model, _cache_dir(args.cache_dir), strategies, args.turns, args.tokens)


def cmd_strategies(args: argparse.Namespace) -> int:
    from agentcache.reuse import STRATEGIES

    for name in STRATEGIES.names():
        print(name)
    return 0


# Subcommands that load a model: (module, parser factory, runner). Each module's runner takes
# (args, model path, cache dir); torch threads and offline mode are set here, once for all.
MODEL_COMMANDS = (
    ("agentcache.bench.cli", "add_parser", "run"),
    ("agentcache.bench.tiers.cli", "add_parser", "run"),
    ("agentcache.server.cli", "add_parser", "serve"),
    ("agentcache.heads.cli", "add_parser", "run"),
    ("agentcache.bench.decode.cli", "add_bench_parser", "run_bench"),
    ("agentcache.bench.decode.dense_cli", "add_dense_parser", "run_dense"),
    ("agentcache.cope.cli", "add_parser", "run"),
)


@dataclass(frozen=True)
class ModelCommand:
    """Runs `module.runner(args, model path, cache dir)` after the common set-up."""

    module: str
    runner: str

    def __call__(self, args: argparse.Namespace) -> int:
        _threads(args.threads)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault(IN_PROCESS_ENV, "0")  # vLLM's engine core here (in_process)
        run = getattr(importlib.import_module(self.module), self.runner)
        return int(run(args, args.model, _cache_dir(args.cache_dir)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcache", description="KV-cache reuse for LLM agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo_help = "run a short agent session and compare each turn with full recompute"
    demo = sub.add_parser("demo", help=demo_help, description=demo_help)
    _common(demo)
    demo.add_argument(
        "--strategies",
        default="prefix,default",
        help="comma list of strategies compared with full recompute (default: prefix,default)",
    )
    demo.add_argument("--turns", type=positive_int, default=6, help="number of agent turns")
    demo.add_argument("--tokens", type=non_negative_int, default=24, help="new tokens per turn")
    demo.set_defaults(func=cmd_demo)
    for module, factory, runner in MODEL_COMMANDS:
        command = getattr(importlib.import_module(module), factory)(sub)
        _common(command)
        command.set_defaults(func=ModelCommand(module, runner))
    from agentcache.bench.tiers import replay_cli

    replay_cli.add_parser(sub)
    strategies_help = "list the registered reuse strategies"
    strategies = sub.add_parser("strategies", help=strategies_help, description=strategies_help)
    strategies.set_defaults(func=cmd_strategies)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = 1  # until the command returns
    try:
        code = int(args.func(args))
        return code
    except AgentCacheError as e:
        code = 2
        print(f"agentcache: error: {e}", file=sys.stderr)
        return code
    finally:
        end_outputs(failed=code != 0)  # a failed command leaves no empty output folder


if __name__ == "__main__":
    sys.exit(main())
