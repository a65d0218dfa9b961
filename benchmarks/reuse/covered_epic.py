"""Would chunk-start recompute on the default's exact turns keep its fidelity floor? Replayed
on stored per-turn records: chosen on tuning sessions, then read on validation sessions.

The default (`rpdc`, `cover=1.5`) computes every reused token whose context changed on a
turn whose candidates are few beside the tokens it computes anyway ("covered", exact). The
rule replayed here: on a covered turn run `epic` instead, when its up-front selection computes
no more tokens than the exact plan (`epic` computes a subset of them: chunk starts, not whole
moved segments), and the default's own plan on every other turn.

- Tuning (the choice): the runs of `rpdc` without cover (docs/bench/tune-cover/, sessions
  -00..-03: `candidates`, `computed_anyway` per turn) say which turns `cover=1.5` covers, as
  `cover_choice.py` does; `epic`'s record of the same turn comes from docs/bench/wide-budget-*
  (tuning sessions -00..-07, another run: fidelity and compute are deterministic, so only
  TTFT is not read from it).
- Validation (the report): docs/bench/validate-* ran the default, `epic` and `prefix` in one
  run, so each turn's TTFT over `prefix`'s is a within-run ratio of measured turns. The
  rule's TTFT is the measured TTFT of the strategy it picks on that turn (a replay of one
  run's turns, not a run of the rule: a turn's store would differ after an `epic` turn).

    python benchmarks/reuse/covered_epic.py --out docs/bench/planner/covered-epic

writes tune/results.json, validate/results.json (one split each) and report.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.report import covered_at, exact_compute, exact_turn

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("memgpt", "reflexion", "swe_agent")
COVER = 1.5  # the default's
Row = dict[str, Any]


def by_turn(run: dict[str, Any], strategy: str) -> dict[tuple[str, int], Row]:
    return {(t["session"], t["turn"]): t for t in run["turns"]
            if t["strategy"] == strategy and t["turn"] > 0}  # fmt: skip


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "results.json").read_text()))


def tuning(bench: Path, family: str, label: str = "rpdc") -> list[dict[str, Any]]:
    """Per warm tuning turn: covered, and (greedy, first token, tf KL, compute) of the default
    and of the rule. `label`: rpdc without cover in the tune-cover runs."""
    uncovered = by_turn(load(bench / "tune-cover" / family), label)
    epic = by_turn(load(bench / f"wide-budget-{family}"), "epic")
    out = []
    for key, a in sorted(uncovered.items()):
        covered = covered_at(a, COVER)
        if covered:
            exact = exact_compute(a)
            default = (1.0, 1.0, 0.0, exact)
            e = epic.get(key)
            if e is None:
                raise SystemExit(f"{family}: no epic record of tuning turn {key}")
            rule = fidelity(e) if e["recompute_fraction"] <= exact else default
        else:
            default = rule = fidelity(a)
        out.append({"turn": list(key), "covered": covered, "default": default, "rule": rule})
    return out


def validation(bench: Path, family: str) -> list[dict[str, Any]]:
    """Per warm validation turn: covered, and (greedy, first token, tf KL, compute, TTFT over
    prefix's in the same run) of the default, of `epic` and of the rule."""
    run = load(bench / f"validate-{family}")
    default, epic, prefix = (by_turn(run, s) for s in ("rpdc", "epic", "prefix"))
    out = []
    for key, d in sorted(default.items()):
        e, p = epic[key], prefix[key]
        covered = exact_turn(d)
        pick = e if covered and e["recompute_fraction"] <= d["recompute_fraction"] else d
        out.append({"turn": list(key), "covered": covered, "default": cells(d, p),
                    "epic": cells(e, p), "rule": cells(pick, p)})  # fmt: skip
    return out


def fidelity(r: Row) -> tuple[float, float, float, float]:
    """(greedy, first token, tf KL, compute) of a turn's record."""
    return (float(r["greedy_exact_match"]), float(r["first_token_agreement"]),
            float(r["tf_kl"]), float(r["recompute_fraction"]))  # fmt: skip


def cells(r: Row, prefix: Row) -> tuple[float, ...]:
    """`fidelity`, and the TTFT over `prefix`'s on the same turn."""
    return (*fidelity(r), r["ttft_ms"] / prefix["ttft_ms"])


def summary(turns: list[dict[str, Any]], who: str) -> dict[str, float]:
    cols = list(zip(*(t[who] for t in turns), strict=True))
    s = {"greedy": statistics.fmean(cols[0]), "first_token": statistics.fmean(cols[1]),
         "tf_kl_median": statistics.median(cols[2]),
         "compute": statistics.fmean(cols[3])}  # fmt: skip
    if len(cols) > 4:
        s |= {"ttft_vs_prefix_median": statistics.median(cols[4]),
              "ttft_vs_prefix_min": min(cols[4]), "ttft_vs_prefix_max": max(cols[4])}  # fmt: skip
    return s


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, default=ROOT / "docs/bench")
    p.add_argument("--target", type=float, default=0.9, help="greedy exact match to keep")
    p.add_argument("--uncovered", default="rpdc",
                   help="the label of rpdc without cover in the tune-cover runs (default: rpdc, "
                   "as stored; cover_choice.py's --uncovered)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="folder for results.json, report.md")
    args = p.parse_args(argv)
    results: dict[str, Any] = {"tune": {}, "validate": {}}
    lines = [
        "# Chunk-start recompute on the default's exact turns",
        "",
        "`python benchmarks/reuse/covered_epic.py --out docs/bench/planner/covered-epic`",
        "",
        "Rule: on a turn the default covers (computes every reused token whose context changed),"
        " run `epic` when it computes no more tokens; the default's plan on every other turn. "
        "Greedy: share of warm turns whose 32-token continuation equals `full`'s; compute: mean "
        "share of prompt tokens computed; TTFT: median over the turns of TTFT over `prefix`'s on"
        " the same turn, in one run (range in brackets; validation only).",
        "",
        "| split | family | turns | covered | who | greedy | first token | tf KL (median) "
        "| compute | TTFT / prefix |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    chosen = True
    for family in FAMILIES:
        tune = tuning(args.bench, family, args.uncovered)
        val = validation(args.bench, family)
        for split, turns, who in (("tune", tune, ("default", "rule")),
                                  ("validate", val, ("default", "epic", "rule"))):  # fmt: skip
            results[split][family] = {"turns": turns, **{w: summary(turns, w) for w in who}}
            covered = sum(t["covered"] for t in turns)
            for w in who:
                s = results[split][family][w]
                ttft = (f"{s['ttft_vs_prefix_median']:.3f} ({s['ttft_vs_prefix_min']:.3f}-"
                        f"{s['ttft_vs_prefix_max']:.3f})" if "ttft_vs_prefix_median" in s
                        else "-")  # fmt: skip
                lines.append(
                    f"| {split} | {family} | {len(turns)} | {covered} | {w} | {s['greedy']:.2f} "
                    f"| {s['first_token']:.2f} | {s['tf_kl_median']:.1e} | {s['compute']:.3f} "
                    f"| {ttft} |"
                )
        chosen &= results["tune"][family]["rule"]["greedy"] >= args.target
    held = {f: results["validate"][f]["rule"]["greedy"] >= args.target for f in FAMILIES}
    lines += [
        "",
        f"Chosen on tuning (greedy >= {args.target:g} on every family): "
        f"**{'yes' if chosen else 'no'}**. On validation, greedy >= {args.target:g}: "
        + ", ".join(f"{f} {'yes' if ok else 'no'}" for f, ok in held.items())
        + ".",
    ]
    command = "python benchmarks/reuse/covered_epic.py --out docs/bench/planner/covered-epic"
    for split, sources, verdict in (
        ("tune", "docs/bench/tune-cover/<family>, docs/bench/wide-budget-<family>",
         {"reached": chosen}),
        ("validate", "docs/bench/validate-<family>", {"reached": held}),
    ):  # fmt: skip
        folder = args.out / split
        folder.mkdir(parents=True, exist_ok=True)
        record = {"split": split, "command": command, "sources": sources, "cover": COVER,
                  "target": args.target, **verdict, "families": results[split]}  # fmt: skip
        (folder / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    text = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
