"""`agentcache` command line. Environment variables are read here and nowhere else."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from agentcache.errors import AgentCacheError


def _threads(value: int | None) -> None:
    import torch

    n = value or int(os.environ.get("AGENTCACHE_NUM_THREADS", "0")) or os.cpu_count() or 1
    torch.set_num_threads(n)


def _cache_dir(value: str | None) -> Path:
    from agentcache.model.loading import default_cache_dir

    return Path(value or os.environ.get("AGENTCACHE_CACHE_DIR") or default_cache_dir())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (default: embedded SmolLM2-135M)")
    p.add_argument("--cache-dir", default=None, help="cache folder (env AGENTCACHE_CACHE_DIR)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")


def cmd_demo(args: argparse.Namespace) -> int:
    from agentcache.demo import run_demo

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    return run_demo(args.model, _cache_dir(args.cache_dir), strategies, args.turns, args.tokens)


def cmd_bench(args: argparse.Namespace) -> int:
    from agentcache.bench.cli import run

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run(args, args.model, _cache_dir(args.cache_dir))


def cmd_serve(args: argparse.Namespace) -> int:
    from agentcache.server.cli import serve

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return serve(args, args.model, _cache_dir(args.cache_dir))


def cmd_bench_tiers(args: argparse.Namespace) -> int:
    from agentcache.bench.tiers_cli import run

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run(args, args.model, _cache_dir(args.cache_dir))


def cmd_strategies(args: argparse.Namespace) -> int:
    from agentcache.reuse import STRATEGIES

    for name in STRATEGIES.names():
        print(name)
    return 0


def cmd_profile_heads(args: argparse.Namespace) -> int:
    from agentcache.decode.cli import run_profile

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_profile(args, args.model, _cache_dir(args.cache_dir))


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from agentcache.decode.cli import run_bench

    _threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run_bench(args, args.model, _cache_dir(args.cache_dir))


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
    demo.add_argument("--turns", type=int, default=6, help="number of agent turns")
    demo.add_argument("--tokens", type=int, default=24, help="new tokens per turn")
    demo.set_defaults(func=cmd_demo)
    from agentcache.bench.cli import add_parser as add_bench

    bench = add_bench(sub)
    _common(bench)
    bench.set_defaults(func=cmd_bench)
    from agentcache.server.cli import add_parser as add_serve

    serve = add_serve(sub)
    _common(serve)
    serve.set_defaults(func=cmd_serve)
    from agentcache.decode.cli import add_bench_parser, add_profile_parser

    for add, func in (
        (add_profile_parser, cmd_profile_heads),
        (add_bench_parser, cmd_bench_decode),
    ):
        _common(sub_parser := add(sub))
        sub_parser.set_defaults(func=func)
    from agentcache.bench.tiers_cli import add_parser as add_bench_tiers

    bench_tiers = add_bench_tiers(sub)
    _common(bench_tiers)
    bench_tiers.set_defaults(func=cmd_bench_tiers)
    strategies_help = "list the registered reuse strategies"
    strategies = sub.add_parser("strategies", help=strategies_help, description=strategies_help)
    strategies.set_defaults(func=cmd_strategies)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except AgentCacheError as e:
        print(f"agentcache: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
