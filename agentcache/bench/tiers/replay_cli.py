"""`agentcache replay-trace`: a saved store trace replayed without the model, optionally profiled.

`agentcache bench-tiers --save-traces` writes each policy's trace to `OUT/traces/`. Replaying
one repeats the run's store calls on a fresh store of the same configuration and reports the
store-only turns/s (as bench-tiers does), checks that the replay repeated the run's disk
writes, and with `--profile` writes a cProfile of one more replay and prints where its time
went: the store's own cost studied in a minute, without running the model again.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentcache.argtypes import non_negative_int, output_folder, path_arg, positive_int

if TYPE_CHECKING:
    from agentcache.bench.tiers.trace_file import SavedTrace


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    about = "replay saved store traces (bench-tiers --save-traces) without the model"
    p = sub.add_parser("replay-trace", help=about, description=about)
    p.add_argument("traces", nargs="+", type=path_arg, help="trace files (*.trace.json.gz)")
    p.add_argument("--replays", type=non_negative_int, default=3,
                   help="timed replays per trace, median reported (default 3)")  # fmt: skip
    disk = "parent of the replays' disk tier folders, created if missing (default: temp folder)"
    p.add_argument("--disk-dir", type=path_arg, default=None, help=disk)
    p.add_argument("--profile", type=path_arg, default=None, metavar="FILE",
                   help="profile one more replay of each trace; write its pstats to FILE "
                        "(FILE.<n> for the n-th trace when several are given)")  # fmt: skip
    p.add_argument("--top", type=positive_int, default=25,
                   help="functions printed from the profile (default 25)")  # fmt: skip
    p.add_argument("--sort", choices=("tottime", "cumulative"), default="tottime",
                   help="profile order (default tottime: time in the function itself)")  # fmt: skip
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from rich.console import Console  # here: `agentcache --help` does not load torch

    from agentcache.bench.reuse.report import markdown_table
    from agentcache.bench.tiers.bench import replays
    from agentcache.bench.tiers.trace_file import load

    console = Console(stderr=True)
    saved = [load(path) for path in args.traces]  # every file checked before any replay
    if args.disk_dir is not None:
        output_folder(args.disk_dir, "--disk-dir")
    rows, failed = [], []
    for n, (path, s) in enumerate(zip(args.traces, saved, strict=True)):
        t = s.trace
        turns = sum(k for _, k in t.rounds)
        with console.status(f"replaying {path.name} ({len(t.ops)} store calls) x{args.replays}"):
            summary = replays(s, args.replays, "replay", args.disk_dir)
        if summary is not None:
            rows.append(_row(path, s.config.spill, len(t.ops), turns, summary))
            if not summary["matches_run"]:
                failed.append(f"{path}: " + "; ".join(summary["mismatches"][:3]))
        if args.profile is not None:
            out = args.profile if len(saved) == 1 else args.profile.with_name(
                f"{args.profile.name}.{n}")  # fmt: skip
            with console.status(f"profiling a replay of {path.name}"):
                text = _profile(s, args.disk_dir, out, args.sort, args.top)
            print(f"\n## {path} ({s.config.spill}): profile of one replay, by {args.sort}\n")
            print(text)
            print(f"wrote {out} (open with python -m pstats {out})")
    if rows:
        head = ["trace", "policy", "store calls", "turns", "turns/s", "turns/s std",
                "replays s", "matches run"]  # fmt: skip
        print(markdown_table(head, rows))
    for line in failed:
        console.print(f"[red]the replay did not repeat the run:[/] {line}")
    return 1 if failed else 0


def _row(path: Path, policy: str, ops: int, turns: int, r: dict[str, Any]) -> list[str]:
    return [
        path.name, policy, str(ops), str(turns), f"{r['turns_per_s']:.2f}",
        f"{r['throughput_std']:.2f}", ", ".join(f"{x:.1f}" for x in r["replays_s"]),
        "yes" if r["matches_run"] else "no",
    ]  # fmt: skip


def _profile(saved: SavedTrace, disk_root: Path | None, out: Path, sort: str, top: int) -> str:
    from agentcache.bench.tiers.bench import fresh_store
    from agentcache.bench.tiers.trace import replay

    profiler = cProfile.Profile()
    with fresh_store(saved, "replay-profile", disk_root) as store:
        profiler.enable()
        try:
            replay(saved.trace, store, saved.expected)
        finally:
            profiler.disable()
    out.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(out)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(top)
    return text.getvalue().strip()
