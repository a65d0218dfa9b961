"""How `rpdc`'s `cover` was chosen: the rule replayed on stored tuning-session runs.

A run of `agentcache bench` with `full`, `prefix` and `rpdc` without cover (`rpdc:cover=0`;
the runs in docs/bench/tune-cover/ were taken when that was `rpdc`'s default, so they name it
`rpdc`, `--uncovered`'s default) records per warm turn the reused tokens whose context
changed (`candidates`) and the tokens computed anyway (`computed_anyway`). With `cover=c`, a
turn whose candidates number at most c per token computed anyway computes them all: its
output is full recompute's (greedy agreement 1, KL 0) at (computed anyway + candidates) /
prompt of full's compute, with no probe; every other turn is the run's own turn. The script
replays that for each c, per family, and picks the smallest c with greedy exact match >=
--target on every family.

    python benchmarks/reuse/cover_choice.py docs/bench/tune-cover/{reflexion,memgpt,swe_agent} \
        --out docs/bench/tune-cover/cover.md

Only tuning sessions belong here: the chosen value is then reported on validation sessions.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.report import covered_at, exact_compute

COVERS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def warm_turns(run: dict[str, Any], uncovered: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(row of rpdc without cover, prefix's row) per warm turn."""
    rows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for t in run["turns"]:
        if t["turn"] > 0:
            rows.setdefault((t["session"], t["turn"]), {})[t["strategy"]] = t
    missing = [k for k, r in rows.items() if uncovered not in r or "prefix" not in r]
    if missing:
        raise SystemExit(f"turns without both {uncovered} and prefix: {missing[:3]}")
    return [(r[uncovered], r["prefix"]) for _, r in sorted(rows.items())]


def replay(turns: list[tuple[dict[str, Any], dict[str, Any]]], cover: float) -> dict[str, float]:
    rows = []  # (greedy exact, first token, KL tf, compute, covered) per turn
    for a, _ in turns:
        if covered_at(a, cover):
            rows.append((1.0, 1.0, 0.0, exact_compute(a), 1.0))
        else:
            rows.append((a["greedy_exact_match"], a["first_token_agreement"], a["tf_kl"],
                         a["recompute_fraction"], 0.0))  # fmt: skip
    ge, ft, kl, compute = (statistics.fmean(col) for col in list(zip(*rows, strict=True))[:4])
    covered = int(sum(r[4] for r in rows))
    return {"greedy_exact": ge, "first_token": ft, "tf_kl": kl, "compute": compute,
            "covered": covered, "turns": len(rows)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench output folders (one per family)")
    p.add_argument("--target", type=float, default=0.9, help="greedy exact match to reach")
    p.add_argument("--uncovered", default="rpdc",
                   help="the label of rpdc without cover in the runs (default: rpdc, as in "
                   "docs/bench/tune-cover/)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    lines = ["| family | cover | turns covered | greedy exact | first token | KL tf | compute "
             "| prefix's compute |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    reached: dict[float, bool] = dict.fromkeys(COVERS, True)
    for folder in args.runs:
        run = json.loads((folder / "results.json").read_text())
        if run.get("split") != "tune":
            raise SystemExit(f"{folder}: not a tuning-session run (split {run.get('split')!r})")
        turns = warm_turns(run, args.uncovered)
        family = turns[0][0]["workload"]
        prefix = statistics.fmean(p["recompute_fraction"] for _, p in turns)
        for c in COVERS:
            r = replay(turns, c)
            reached[c] &= r["greedy_exact"] >= args.target
            lines.append(
                f"| {family} | {c:g} | {r['covered']} of {r['turns']} | {r['greedy_exact']:.2f} "
                f"| {r['first_token']:.2f} | {r['tf_kl']:.1e} | {r['compute']:.3f} | {prefix:.3f} |"
            )
    chosen = min((c for c, ok in reached.items() if ok), default=None)
    verdict = f"Smallest cover with greedy exact match >= {args.target:g} on every family: " + (
        f"**{chosen:g}**." if chosen is not None else "none of the values tried."
    )
    text = "\n".join(["# rpdc's cover on tuning sessions", "", *lines, "", verdict]) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
