#!/usr/bin/env python3
"""The reuse default against its targets, per family, from stored validation runs.

For each family's run (warm turns; `agentcache bench` results.json with `full`, `prefix`, the
default and the `transformers-prefix` peer): the default's greedy exact match, first-token
agreement, TTFT against `prefix` and the peer, and whether another strategy of the run
dominates it. For a speed target the default misses, the same run says whether any strategy
reached it at the fidelity floor (greedy exact >= 0.9, first token >= 0.99), and how the
default's compute compares with the peer's, which computes exactly what exact reuse cannot
supply. Cold turns (a run with `--max-turns 1`): each strategy's TTFT against `full`'s and
what it spends besides computing, less `full`'s own on the same turn, as a share of `full`'s
TTFT.

    python benchmarks/reuse/targets.py docs/bench/validate-{reflexion,memgpt,swe_agent,chat} \
        --cold docs/bench/cold --out docs/bench/targets

With `--workloads` (the runs' workload files), the warm turns are also split by each turn's
edit (agentcache.workload.edits: `append`, or the family's edit such as `system`, `clear`,
`retry`): per kind, every strategy but `full` and `prefix` on those turns alone, as the edit
families' targets speak of the turns that carry the edit.

Writes targets.md and targets.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.planner.report import by_turn
from agentcache.bench.reuse.report import cold as cold_turns
from agentcache.bench.reuse.report import dominated_by, exact_turn
from agentcache.workload.edits import check_edits

GREEDY, FIRST = 0.9, 0.99  # the fidelity floor
VS_PREFIX, VS_PEER, COLD = 0.8, 0.67, 1.03  # the speed targets
PEER = "transformers-prefix"


def faithful(s: dict[str, Any]) -> bool:
    return bool(s["greedy_exact_match"] >= GREEDY and s["first_token_agreement"] >= FIRST)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def covered_split(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The default's warm turns split by whether it computed every reused token whose context
    changed (`cover` acted, the probe had nothing worth ranking, or there was no such token):
    per part, the turn count, the median TTFT / the peer's on the same turn, and the mean
    compute of each (None: the run predates the `candidates` field)."""
    rows = by_turn(results["turns"])
    pairs = [(r[name], r[PEER]) for r in rows.values() if name in r and PEER in r]
    if not pairs or any("candidates" not in d for d, _ in pairs):
        return None
    out = {}
    for part, wanted in (("exact", True), ("ranked", False)):
        chosen = [(d, p) for d, p in pairs if exact_turn(d) == wanted]
        out[part] = {
            "turns": len(chosen),
            "vs_peer": median([d["ttft_ms"] / p["ttft_ms"] for d, p in chosen]),
            "compute": statistics.fmean(d["recompute_fraction"] for d, _ in chosen)
            if chosen
            else None,
            "peer_compute": statistics.fmean(p["recompute_fraction"] for _, p in chosen)
            if chosen
            else None,
        }
    return out


def vs_base(results: dict[str, Any], name: str, base: str) -> float:
    """Median over warm turns of `name`'s TTFT / `base`'s on the same turn of the run."""
    turns = {(t["session"], t["turn"], t["strategy"]): t["ttft_ms"] for t in results["turns"]}
    ratios = [ms / turns[(s, t, base)] for (s, t, x), ms in turns.items()
              if x == name and t > 0 and (s, t, base) in turns]  # fmt: skip
    return float(statistics.median(ratios))


def family(
    results: dict[str, Any],
    vs_prefix_target: float = VS_PREFIX,
    vs_peer_target: float | None = VS_PEER,
    default: str | None = None,
) -> dict[str, Any]:
    """The default's standing in one run against the speed targets given (no peer target:
    None, and `met` leaves it out). `default`: the label that measured today's default, where
    the run's own default was another (a run from before the default changed)."""
    strategies = results["strategies"]
    name = default or results["default_strategy"]
    d, prefix = strategies[name], strategies["prefix"]
    vs_prefix = vs_base(results, name, "prefix")
    vs_peer = d.get("ttft_ratio_vs_peer")
    dominated = dominated_by(strategies)[name]
    floor = {o: s for o, s in strategies.items() if faithful(s) and o != PEER}
    fastest = {o: vs_base(results, o, "prefix") for o in floor}
    best_prefix = min(fastest, key=lambda o: fastest[o])
    best_peer = min(
        (o for o in floor if "ttft_ratio_vs_peer" in floor[o]),
        key=lambda o: floor[o]["ttft_ratio_vs_peer"],
        default=None,
    )
    return {
        "workloads": sorted(results["by_workload"]),
        "sessions": results["sessions"],
        "turns": d["turns"],
        "default": name,
        "greedy_exact": d["greedy_exact_match"],
        "first_token": d["first_token_agreement"],
        "ttft_vs_full": d["ttft_ratio_vs_full"],
        "compute": d["recompute_fraction_mean"],
        "vs_prefix": vs_prefix,
        "vs_peer": vs_peer,
        "dominated_by": dominated,
        "prefix_compute": prefix["recompute_fraction_mean"],
        "peer_compute": strategies[PEER]["recompute_fraction_mean"] if PEER in strategies else None,
        "by_turn_kind": covered_split(results, name),
        "fastest_faithful_vs_prefix": {
            "strategy": best_prefix,
            "ratio": fastest[best_prefix],
        },
        "fastest_faithful_vs_peer": None
        if best_peer is None
        else {"strategy": best_peer, "ratio": floor[best_peer]["ttft_ratio_vs_peer"]},
        "met": {
            "greedy_exact": d["greedy_exact_match"] >= GREEDY,
            "first_token": d["first_token_agreement"] >= FIRST,
            "undominated": not dominated,
            "vs_prefix": vs_prefix <= vs_prefix_target,
        }
        | (
            {}
            if vs_peer_target is None
            else {"vs_peer": vs_peer is not None and vs_peer <= vs_peer_target}
        ),
    }


def turn_edits(paths: list[Path]) -> dict[tuple[str, int], str]:
    """(session, turn) -> the turn's edit kind, from workload files; `start` reads `append`
    (a session's first turn is cold, and a fork's first request is `fork`)."""
    out = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                session = json.loads(line)
                for e in check_edits(session):
                    out[(session["name"], e.turn)] = "append" if e.kind == "start" else e.kind
    return out


def by_edit(results: dict[str, Any], kinds: dict[tuple[str, int], str]) -> dict[str, Any]:
    """Per edit kind of the run's warm turns, per strategy but `full` and `prefix`: its turns,
    greedy exact and first-token shares, TTFT / `prefix`'s on the same turn (median, min, max)
    and mean compute beside `prefix`'s. SystemExit when a turn has no kind (another file)."""
    out: dict[str, Any] = {}
    for key, row in sorted(by_turn(results["turns"]).items()):
        if key not in kinds:
            raise SystemExit(f"{key[0]} turn {key[1]}: not in the workload files given")
        if "prefix" not in row:
            continue
        prefix = row["prefix"]
        for name, t in row.items():
            if name in ("full", "prefix"):
                continue
            part = out.setdefault(kinds[key], {}).setdefault(name, {"rows": []})
            part["rows"].append((t, prefix))
    for kind in out.values():
        for part in kind.values():
            pairs = part.pop("rows")
            ratios = [t["ttft_ms"] / p["ttft_ms"] for t, p in pairs]
            part |= {
                "turns": len(pairs),
                "greedy_exact": statistics.fmean(t["greedy_exact_match"] for t, _ in pairs),
                "first_token": statistics.fmean(t["first_token_agreement"] for t, _ in pairs),
                "vs_prefix": statistics.median(ratios),
                "vs_prefix_min": min(ratios),
                "vs_prefix_max": max(ratios),
                "compute": statistics.fmean(t["recompute_fraction"] for t, _ in pairs),
                "prefix_compute": statistics.fmean(p["recompute_fraction"] for _, p in pairs),
            }
    return out


def render_by_edit(families: dict[str, dict[str, Any]], vs_prefix_target: float) -> list[str]:
    lines = [
        "",
        "## By edit",
        "",
        "Each family's warm turns by the edit they carry (`append`: the request extends the "
        "previous one); per strategy on those turns: greedy exact and first-token shares, "
        "TTFT / `prefix`'s on the same turn (median of per-turn ratios, min-max) against "
        f"the {vs_prefix_target}x target (the default's, on edited turns), and mean compute "
        "(prefix's):",
        "",
        "| family | edit | strategy | n | greedy exact | first token | TTFT vs prefix | "
        "compute (prefix's) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fam, f in families.items():
        for kind, strategies in sorted(f["by_edit"].items(), key=lambda kv: kv[0] == "append"):
            for name, s in sorted(
                strategies.items(), key=lambda kv: (kv[0] != f["default"], kv[0])
            ):
                speed = f"{s['vs_prefix']:.2f}x ({s['vs_prefix_min']:.2f}-{s['vs_prefix_max']:.2f})"
                if kind != "append" and name == f["default"]:
                    speed += f" ({mark(s['vs_prefix'] <= vs_prefix_target)})"
                lines.append(
                    f"| {fam} | {kind} | `{name}` | {s['turns']} | {s['greedy_exact']:.2f} | "
                    f"{s['first_token']:.2f} | {speed} | {s['compute']:.3f} "
                    f"({s['prefix_compute']:.3f}) |"
                )
    return lines


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render(
    families: dict[str, dict[str, Any]],
    cold: dict[str, Any] | None,
    cmd: str,
    vs_prefix_target: float = VS_PREFIX,
    vs_peer_target: float | None = VS_PEER,
) -> str:
    lines = [
        "# The reuse default against its targets",
        "",
        f"Command: `{cmd}`",
        "",
        f"Fidelity floor: greedy exact >= {GREEDY}, first token >= {FIRST}. Speed: TTFT <= "
        f"{vs_prefix_target}x `prefix`'s"
        + ("" if vs_peer_target is None else f" and <= {vs_peer_target}x the `{PEER}` peer's")
        + " (median over warm turns of the per-turn ratio, within one run)"
        + ("." if cold is None else f"; cold turns <= {COLD}x `full`."),
        "",
        "| family | n warm | greedy exact | first token | dominated by | TTFT vs prefix | "
        "TTFT vs peer | compute: default / prefix / peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fam, f in families.items():
        peer = "-" if f["vs_peer"] is None else f"{f['vs_peer']:.2f}x"
        peer += f" ({mark(f['met']['vs_peer'])})" if "vs_peer" in f["met"] else ""
        pc = "-" if f["peer_compute"] is None else f"{f['peer_compute']:.3f}"
        lines.append(
            f"| {fam} | {f['turns']} | {f['greedy_exact']:.2f} ({mark(f['met']['greedy_exact'])})"
            f" | {f['first_token']:.2f} ({mark(f['met']['first_token'])}) | "
            f"{', '.join(f['dominated_by']) or 'none'} | {f['vs_prefix']:.2f}x "
            f"({mark(f['met']['vs_prefix'])}) | {peer} | {f['compute']:.3f} / "
            f"{f['prefix_compute']:.3f} / {pc} |"
        )
    lines += [
        "",
        "For each speed target missed, the fastest strategy of the same run at the fidelity "
        "floor (greedy exact and first token as above):",
        "",
    ]
    for fam, f in families.items():
        for key, target, label in (
            ("vs_prefix", vs_prefix_target, "prefix"),
            ("vs_peer", vs_peer_target, "peer"),
        ):
            if f["met"].get(key, True):
                continue
            best = f[f"fastest_faithful_{key}"]
            if best is None:
                continue
            reach = "reaches" if best["ratio"] <= target else "does not reach"
            lines.append(
                f"- {fam}, TTFT <= {target}x {label}: the fastest at the floor is "
                f"`{best['strategy']}` at {best['ratio']:.2f}x, which {reach} it."
            )
    kinds = {fam: f["by_turn_kind"] for fam, f in families.items() if f["by_turn_kind"]}
    if kinds:  # (the peer's runs only: no peer, no such table)
        lines += [
            "",
            "The default's warm turns by kind: exact (every reused token whose context changed "
            "was computed: `cover` acted, or there were none) and ranked (the probe chose "
            "`extra` of them); median TTFT / the peer's on the same turn, and mean compute:",
            "",
            "| family | exact turns | vs peer | compute (peer's) | ranked turns | vs peer | "
            "compute (peer's) |",
            "|---|---|---|---|---|---|---|",
        ]

    def part(k: dict[str, Any]) -> str:
        if not k["turns"]:
            return "0 | - | -"
        return f"{k['turns']} | {k['vs_peer']:.2f}x | {k['compute']:.3f} ({k['peer_compute']:.3f})"

    for fam, k in kinds.items():
        lines.append(f"| {fam} | {part(k['exact'])} | {part(k['ranked'])} |")
    split = {fam: f for fam, f in families.items() if "by_edit" in f}
    if split:
        lines += render_by_edit(split, vs_prefix_target)
    if cold is not None:
        lines += [
            "",
            f"## Cold turns ({cold['turns']} first turns: "
            f"{', '.join(cold['workloads'])}; sessions {cold['sessions'][0]}..)",
            "",
            "| strategy | TTFT / full, median (max) | added besides computing, share of full's "
            "TTFT: median (max) |",
            "|---|---|---|",
        ]
        for s, c in cold["strategies"].items():
            added = (
                f"{c['added_median']:+.2%} ({c['added_max']:+.2%})" if "added_median" in c else "-"
            )
            lines.append(f"| {s} | {c['median']:.2f} ({c['max']:.2f}) | {added} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="validation bench folders, one per family")
    p.add_argument("--cold", type=Path, default=None, help="a bench folder of first turns")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--vs-prefix", type=float, default=VS_PREFIX, help="TTFT target vs prefix")
    p.add_argument("--vs-peer", type=float, default=VS_PEER, help="TTFT target vs the peer")
    p.add_argument("--no-peer-target", action="store_true", help="report the peer, no target")
    p.add_argument(
        "--workloads",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSONL",
        help="the runs' workload files: split warm turns by each turn's edit",
    )
    p.add_argument("--default", default=None, metavar="LABEL",
                   help="the runs' label for today's default (default: the run's own)")  # fmt: skip
    args = p.parse_args()
    kinds = None if args.workloads is None else turn_edits(args.workloads)
    peer_target = None if args.no_peer_target else args.vs_peer
    targets = {"vs_prefix_target": args.vs_prefix, "vs_peer_target": peer_target}
    families = {}
    for run in args.runs:
        results = json.loads((run / "results.json").read_text())
        if results["split"] != "validate":
            raise SystemExit(f"{run}: split {results['split']!r}, not validation sessions")
        fam = family(results, **targets, default=args.default)
        if kinds is not None:
            fam["by_edit"] = by_edit(results, kinds)
        families[", ".join(sorted(results["by_workload"]))] = fam
    cold = None
    if args.cold is not None:
        results = json.loads((args.cold / "results.json").read_text())
        by_strategy = cold_turns(results["turns"])
        cold = {
            "strategies": by_strategy,
            "turns": max(c["turns"] for c in by_strategy.values()),
            "workloads": sorted(results["by_workload"])
            or sorted({t["workload"] for t in results["turns"]}),
            "sessions": results["sessions"],
        }
    cmd = "python benchmarks/reuse/targets.py " + " ".join(str(r) for r in args.runs)
    cmd += f" --cold {args.cold}" if args.cold else ""
    cmd += "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}"
        for k, d in (("vs_prefix", VS_PREFIX), ("vs_peer", VS_PEER))
        if getattr(args, k) != d
    )
    cmd += " --no-peer-target" if args.no_peer_target else ""
    if args.workloads:
        cmd += " --workloads " + " ".join(str(w) for w in args.workloads)
    cmd += f" --out {args.out}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "targets.json").write_text(
        json.dumps({"families": families, "cold": cold, "targets": targets}, indent=1) + "\n"
    )
    md = render(families, cold, cmd, **targets)
    (args.out / "targets.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
