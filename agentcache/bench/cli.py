"""`agentcache bench`: the public way to measure strategies on a workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from agentcache.argtypes import output_folder, path_arg, positive_int
from agentcache.bench.peer import PEER, TransformersPrefix, load_peer_model
from agentcache.bench.reuse.harness import BenchRunner, parse_specs, sweep_specs
from agentcache.bench.reuse.report import scope_line, table, write_results
from agentcache.errors import ConfigError
from agentcache.model.loading import load_model, model_folder
from agentcache.progress import progress_bar
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.reuse.spec import StrategySpec
from agentcache.workload.files import Session, load_workload

ALL = "full,prefix,promptcache,pic,cacheblend,epic,cacheslide,default,transformers-prefix"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    about = "measure reuse strategies side by side on workload files (JSON Lines)"
    p = sub.add_parser("bench", help=about, description=about)
    p.add_argument("workloads", nargs="+", type=path_arg, help="JSON Lines workload files")
    p.add_argument(
        "--strategies",
        default=ALL,
        help=f"comma list, name or name:key=value (default {ALL}); with --backend vllm, "
        "name@vllm or name@engine sets who computes what reuse cannot supply",
    )
    p.add_argument("--sweep", action="store_true", help="add budget sweeps (rho, tau, r, k)")
    p.add_argument("--out", type=path_arg, default=Path("bench-out"), help="output folder")
    p.add_argument("--max-sessions", type=positive_int, default=None, help="sessions per file")
    p.add_argument("--max-turns", type=positive_int, default=None, help="turns per session")
    p.add_argument(
        "--split",
        choices=("validate", "tune", "all"),
        default=None,
        help="sessions the workload files reserve for reporting (validate, the default), for "
        "choosing settings (tune), or all (the default with --sessions)",
    )
    p.add_argument("--case", default=None, help="only sessions of this case (swing / shift)")
    p.add_argument("--sessions", default=None, help="only these sessions (comma list of names)")
    p.add_argument("--new-tokens", type=positive_int, default=None, help="override max_new_tokens")
    p.add_argument(
        "--backend",
        choices=("embedded", "vllm"),
        default="embedded",
        help="vllm: vLLM + agentcache's connector vs vLLM prefix caching (see docs/vllm.md)",
    )
    p.add_argument("--cope", action="store_true", help="run the model's trained CoPE adapter")
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --backend vllm: reuse the configurations already measured on the same turns "
        "(kept in OUT/configs/) instead of running them again",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="with --backend vllm: run the configurations R times, each round in an order "
        "rotated by one; ratios pair turns of the same round",
    )
    return p


def select(args: argparse.Namespace, console: Console) -> tuple[list[Session], list[str]]:
    """The sessions the filters choose."""
    sessions: list[Session] = []
    problems: list[str] = []
    names = {n.strip() for n in args.sessions.split(",") if n.strip()} if args.sessions else None
    split = chosen_split(args)
    loaded_all: list[Session] = []
    for path in args.workloads:
        loaded = load_workload(path)
        problems += loaded.problems
        loaded_all += loaded.sessions
        chosen = [
            s
            for s in loaded.sessions
            if split in ("all", s.split)
            and args.case in (None, s.case)
            and (names is None or s.name in names)
        ]
        sessions += chosen[: args.max_sessions]
    for p in problems:
        console.print(f"[yellow]warning:[/] {p}")
    if problems:
        console.print(f"[yellow]warning:[/] {len(problems)} workload lines skipped")
    _check_filters(args, names, loaded_all)
    if args.max_turns or args.new_tokens:
        from dataclasses import replace

        sessions = [
            replace(s, turns=tuple(
                replace(t, max_new_tokens=args.new_tokens or t.max_new_tokens)
                for t in s.turns[: args.max_turns]
            ))
            for s in sessions
        ]  # fmt: skip
    if not sessions:  # every file holds a valid session (load_workload): filters left none
        given = (("split", None if split == "all" else split), ("case", args.case),
                 ("sessions", args.sessions))  # fmt: skip
        filters = " and ".join(f"--{k} {v}" for k, v in given if v) or "the filters"
        raise ConfigError(f"no session in the workload files matches {filters}")
    return sessions, problems


def load_peer(model_path: str | None, cache_dir: Path) -> Any:
    """The transformers model of the checkpoint the bench runs (the peer's weights)."""
    return load_peer_model(model_folder(model_path, cache_dir))


def _without_peer_under_cope(
    args: argparse.Namespace, specs: list[StrategySpec], console: Console
) -> list[StrategySpec]:
    """The peer runs the checkpoint as transformers loads it, without a CoPE adapter."""
    if not args.cope or not any(s.label == PEER for s in specs):
        return specs
    if args.strategies != ALL:
        raise ConfigError(f"--cope: {PEER} runs the model without its CoPE adapter; leave it "
                          "out of --strategies")  # fmt: skip
    console.print(f"[yellow]note:[/] {PEER} left out: it runs the model without the adapter")
    return [s for s in specs if s.label != PEER]


def chosen_split(args: argparse.Namespace) -> str:
    """`--split`; without it the validation half, or every split when `--sessions` names the
    sessions (or the command has no `--split`: other benches run every session)."""
    split = getattr(args, "split", "all")
    return split or ("all" if args.sessions else "validate")


def measured(split: str, sessions: list[Session]) -> dict[str, Any]:
    """Which split a run measured and how much of it: for results.json and the report."""
    return {
        "split": split,
        "sessions": [s.name for s in sessions],
        "num_sessions": len(sessions),
        "num_turns": sum(len(s.turns) for s in sessions),
        "splits_measured": sorted({s.split for s in sessions}),
    }


def _check_filters(args: argparse.Namespace, names: set[str] | None, loaded: list[Session]) -> None:
    """--sessions and --case name sessions and cases the workload files hold."""
    if names is not None and (unknown := names - {s.name for s in loaded}):
        known = ", ".join(s.name for s in loaded)
        raise ConfigError(
            f"--sessions: no session named {', '.join(sorted(unknown))} in the workload files; "
            f"they hold: {known}"
        )
    splits = {s.split for s in loaded}
    split = chosen_split(args)
    if split != "all" and split not in splits:
        raise ConfigError(
            f"--split {split}: no session of that split; the files hold {', '.join(sorted(splits))}"
        )
    cases = {s.case for s in loaded}
    if args.case is not None and args.case not in cases:
        labelled = ", ".join(sorted(c for c in cases if c)) or "none (no session has a case)"
        raise ConfigError(f"--case {args.case}: no session of that case; cases: {labelled}")


def run(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    console = Console(stderr=True)
    if args.backend == "vllm":
        from agentcache.bench.vllm.cli import run_vllm, vllm_strategies

        strategies = vllm_strategies(args.strategies, args.strategies == ALL)  # before any work
        sessions, _ = select(args, console)
        output_folder(args.out, "--out")
        return run_vllm(args, strategies, sessions, console)
    if args.resume:
        raise ConfigError(
            "--resume applies to --backend vllm (the embedded bench runs in one process)"
        )
    if args.rounds != 1:
        raise ConfigError(
            "--rounds applies to --backend vllm (the embedded bench times every strategy on "
            "each turn in one process)"
        )
    specs = parse_specs(args.strategies) + (sweep_specs() if args.sweep else [])
    specs = _without_peer_under_cope(args, specs, console)
    sessions, problems = select(args, console)
    output_folder(args.out, "--out")
    model = load_model(model_path, cache_dir)
    if args.cope:  # the adapter trained by `agentcache train-cope` (docs/cope.md)
        from agentcache.cope.checkpoint import load_cope_adapter

        model = load_cope_adapter(model, cache_dir=cache_dir)
    peer = None
    if any(s.label == PEER for s in specs):
        peer = TransformersPrefix(load_peer(model_path, cache_dir))
    runner = BenchRunner(model, specs, peer=peer)
    total = sum(len(s.turns) for s in sessions) * len(specs)
    records = []
    with progress_bar(console) as progress:
        task = progress.add_task("bench", total=total)
        for session in sessions:

            def advance(label: str, name: str = session.name) -> None:
                progress.update(task, advance=1, description=f"{name} {label}")

            records += runner.run_session(session, advance)
    meta = {
        "model": model.model_id,
        "default_strategy": DEFAULT_STRATEGY,
        "command": "agentcache " + " ".join(sys.argv[1:]),
        **measured(chosen_split(args), sessions),
    }
    results = write_results(args.out, records, meta, problems)
    print(scope_line(results))
    print(table(results["strategies"]))
    print(f"\nwrote {args.out}/results.json, report.md and plots")
    return 0
