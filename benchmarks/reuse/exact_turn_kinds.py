#!/usr/bin/env python3
"""The default's exact turns against exact prefix reuse, per family, from stored bench runs.

A warm turn of the default is *exact* when it computed every reused token whose context
changed (`cover` acted, or there was no such token): it then computes what exact prefix
reuse computes, and should cost what `prefix` costs on the same turn. For each run
(`agentcache bench` results.json with `prefix`, the default and, when present, the
`transformers-prefix` peer, every strategy on the same turns in one process): per kind of
warm turn (exact, ranked), the turn count, the median and range of the default's TTFT over
`prefix`'s on the same turn, the mean token-layers computed by each, and the default's greedy
exact match against `full`'s continuation on those turns.

    python benchmarks/reuse/exact_turn_kinds.py docs/bench/exact-turns/swe_agent \
        docs/bench/exact-turns/chat --out docs/bench/exact-turns

Writes exact_turn_kinds.md and exact_turn_kinds.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.provenance import provenance
from agentcache.bench.reuse.report import exact_turn

PEER = "transformers-prefix"
TARGET = 1.01  # exact turns: median TTFT <= 1.01x prefix's


def part(
    rows: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]],
) -> dict[str, Any]:
    """Counts and ratios over (default, prefix, peer) rows of the same turns."""
    if not rows:
        return {"turns": 0}
    ratios = [d["ttft_ms"] / p["ttft_ms"] for d, p, _ in rows]
    peers = [d["ttft_ms"] / q["ttft_ms"] for d, _, q in rows if q is not None]
    return {
        "turns": len(rows),
        "vs_prefix_median": statistics.median(ratios),
        "vs_prefix_min": min(ratios),
        "vs_prefix_max": max(ratios),
        "vs_prefix": ratios,
        "vs_peer_median": statistics.median(peers) if peers else None,
        "compute": statistics.fmean(d["recompute_fraction"] for d, _, _ in rows),
        "prefix_compute": statistics.fmean(p["recompute_fraction"] for _, p, _ in rows),
        "greedy_exact": statistics.fmean(float(d["greedy_exact_match"]) for d, _, _ in rows),
    }


def family(results: dict[str, Any]) -> dict[str, Any]:
    name = results["default_strategy"]
    rows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for t in results["turns"]:
        if t["turn"] > 0:
            rows.setdefault((t["session"], t["turn"]), {})[t["strategy"]] = t
    missing = [s for s in (name, "prefix") if not any(s in r for r in rows.values())]
    if missing:
        raise SystemExit(f"the run has no {missing} turns")
    triples = [(r[name], r["prefix"], r.get(PEER)) for r in rows.values()]
    out = {
        "default": name,
        "sessions": results["sessions"],
        "split": results["split"],
        "command": results["command"],
        "all": part(triples),
        "exact": part([x for x in triples if exact_turn(x[0])]),
        "ranked": part([x for x in triples if not exact_turn(x[0])]),
    }
    e = out["exact"]
    out["met"] = bool(e["turns"] and e["vs_prefix_median"] <= TARGET)
    return out


def fmt(p: dict[str, Any]) -> str:
    if not p["turns"]:
        return "0 | - | - | - | -"
    peer = "-" if p["vs_peer_median"] is None else f"{p['vs_peer_median']:.3f}x"
    return (
        f"{p['turns']} | {p['vs_prefix_median']:.3f}x ({p['vs_prefix_min']:.3f}-"
        f"{p['vs_prefix_max']:.3f}) | {peer} | {p['compute']:.3f} ({p['prefix_compute']:.3f}) "
        f"| {p['greedy_exact']:.2f}"
    )


def report(families: dict[str, Any], command: str) -> str:
    lines = [
        "# The default's exact turns against exact prefix reuse",
        "",
        f"`{command}`",
        "",
        "Warm turns of the default, by kind: exact (every reused token whose context changed was "
        "computed) and ranked (the probe chose among them). TTFT is the median over the turns of "
        "the default's TTFT over `prefix`'s on the same turn, in one run (range in brackets); "
        "compute is the mean share of token-layers computed, the default's (`prefix`'s); greedy "
        f"is the share of turns whose 32-token continuation equals `full`'s. Target: exact turns "
        f"<= {TARGET}x `prefix`.",
        "",
        "| run | default | kind | turns | TTFT / prefix, median (range) | TTFT / peer, median "
        "| compute (prefix's) | greedy exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fam, f in families.items():
        for kind in ("exact", "ranked", "all"):
            lines.append(f"| {fam} | `{f['default']}` | {kind} | {fmt(f[kind])} |")
    lines.append("")
    for fam, f in families.items():
        mark = "met" if f["met"] else "missed"
        lines.append(
            f"- {fam} ({f['split']} sessions {', '.join(f['sessions'])}): exact turns "
            f"{mark}; run: `{f['command']}`"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench folders, one per family")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    families, splits, sessions = {}, set(), []
    for run in args.runs:  # keyed by folder: two runs of one family stay apart
        results = json.loads((run / "results.json").read_text())
        families[run.name] = family(results)
        splits.add(results["split"])
        sessions += [s for s in results["sessions"] if s not in sessions]
    command = "python benchmarks/reuse/exact_turn_kinds.py " + " ".join(map(str, args.runs))
    command += f" --out {args.out}"
    args.out.mkdir(parents=True, exist_ok=True)
    split = splits.pop() if len(splits) == 1 else "mixed"
    record = provenance(
        split=split, sessions=sessions, script="benchmarks/reuse/exact_turn_kinds.py"
    )
    data = {"provenance": record, "command": command, "target": TARGET, "families": families}
    (args.out / "exact_turn_kinds.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "exact_turn_kinds.md").write_text(report(families, command))
    print(report(families, command))


if __name__ == "__main__":
    main()
