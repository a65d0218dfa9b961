"""What `agentcache bench-tiers` figures mean across policies and runs: each round's
throughput, each policy against a base (`ratios`), the store-only bound, and the command line
of the scripts that compare saved runs (`report_runs`)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agentcache.argtypes import path_arg

T = TypeVar("T")


def round_figures(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Throughput over every round, and over the warm rounds alone: a batch's first round
    has nothing to reuse, so its full prefills cost the same under every policy and its
    std mostly measures cold against warm, not the store."""
    tput = [r["turns"] / r["seconds"] for r in rounds]
    warm = [r for r in rounds if r["turn"] > 0]
    warm_tput = [r["turns"] / r["seconds"] for r in warm]
    rounds_s = sum(r["seconds"] for r in rounds)
    return {
        "throughput_turns_per_s": sum(r["turns"] for r in rounds) / rounds_s,
        "throughput_std": statistics.pstdev(tput) if len(tput) > 1 else 0.0,
        "round_throughputs": tput,
        "rounds_s": rounds_s,
        "warm_throughput_turns_per_s": (
            sum(r["turns"] for r in warm) / sum(r["seconds"] for r in warm) if warm else None
        ),
        "warm_throughput_std": statistics.pstdev(warm_tput) if len(warm_tput) > 1 else None,
    }


def throughput_bound(base: dict[str, Any]) -> float | None:
    """The throughput ratio to `base` that a policy whose store calls took no time at all
    would reach: base's rounds' seconds / the same less base's store-only seconds (its
    replay). Compute is the same under every policy, so no spill policy can beat `base`
    by more. None without a replay."""
    store_s = store_only_figure(base, "seconds")
    rounds_s = sum(r["seconds"] for r in base.get("rounds", ()))
    if store_s is None or store_s >= rounds_s:
        return None
    return float(rounds_s / (rounds_s - store_s))


def ratios(policies: dict[str, dict[str, Any]], base: str = "lru") -> dict[str, dict[str, Any]]:
    """Each policy against `base`: the issue's targets as ratios (None where undefined)."""
    if base not in policies:
        return {}
    b = policies[base]

    def div(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else x / y

    return {
        name: {
            "write_amplification_reduction": div(
                b["write_amplification"], p["write_amplification"]
            ),
            "write_calls_ratio": div(p["write_calls"], b["write_calls"]),
            "throughput_ratio": div(p["throughput_turns_per_s"], b["throughput_turns_per_s"]),
            "throughput_std_ratio": div(p["throughput_std"], b["throughput_std"]),
            "warm_throughput_ratio": div(
                p.get("warm_throughput_turns_per_s"), b.get("warm_throughput_turns_per_s")
            ),
            "warm_throughput_std_ratio": div(
                p.get("warm_throughput_std"), b.get("warm_throughput_std")
            ),
            "throughput_bound": throughput_bound(b),
            "store_only_throughput_ratio": div(
                store_only_figure(p, "turns_per_s"), store_only_figure(b, "turns_per_s")
            ),
            "store_only_std_ratio": div(
                store_only_figure(p, "throughput_std"), store_only_figure(b, "throughput_std")
            ),
        }
        for name, p in policies.items()
        if name != base
    }  # fmt: skip


def read_results(path: Path, parse: Callable[[Path, dict[str, Any]], T]) -> T:
    """`parse(path, data)` of a bench-tiers results.json that holds the `slide` and `lru`
    policies. A file that is not JSON, lacks either policy or a field `parse` reads is a
    ValueError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    missing = [p for p in ("slide", "lru") if p not in data.get("policies", {})]
    if missing:
        raise ValueError(f"{path}: no {' or '.join(missing)} policy in its results")
    try:
        return parse(path, data)
    except KeyError as e:
        raise ValueError(f"{path}: no field {e} in its results") from e


def report_runs(
    argv: list[str] | None, description: str, load: Callable[[Path], T],
    table: Callable[[list[T]], str], plot: Callable[[list[T], Path], None], name: str,
) -> int:  # fmt: skip
    """The command line of a script that compares bench-tiers runs: results.json files in,
    `OUT/<name>.md` (the table) and `OUT/<name>.png` (the plot) out. A file `load` rejects
    (ValueError) or cannot read is an error naming it, exit 2, and nothing is written."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("results", nargs="+", type=path_arg, help="bench-tiers results.json files")
    ap.add_argument("--out", type=path_arg, required=True, help="folder for the table and plot")
    args = ap.parse_args(argv)
    try:
        runs = [load(p) for p in args.results]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    md = table(runs)
    (args.out / f"{name}.md").write_text(md, encoding="utf-8")
    plot(runs, args.out / f"{name}.png")
    print(md, end="")
    print(f"wrote {args.out / (name + '.md')} and {args.out / (name + '.png')}")
    return 0


def store_only_figure(policy: dict[str, Any], key: str) -> Any:
    """A figure of a policy's store replay; None without one (`replays=0`, or results from
    before the replay)."""
    replayed = policy.get("store_only")
    return replayed.get(key) if replayed else None
