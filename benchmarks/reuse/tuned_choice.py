#!/usr/bin/env python3
"""A fixed strategy chosen on a tuning run, read on a validation run beside the default.

The rule, fixed before either run was read: on the tuning run's warm turns (its families
pooled), among every strategy but `full`, the `transformers-prefix` peer and the planner
(`plan`), take the one with the lowest median per-turn TTFT / full's that meets the floor
(greedy continuation equal to full's on >= 0.9 of the turns, first token on >= 0.99): the
planner report's oracle rule (`fastest_at_floor`). On the validation run, each of these is
read on the same turns:

    default   the run's default strategy
    plan      the per-turn planner, when the run has it
    tuned     the strategy the rule chose on the tuning run
    oracle    the same rule applied to the validation run itself (it saw the results: a bound)

with the issue's targets for the default and the planner: the floor; TTFT within 1.05x the
oracle's (median of per-turn ratios); no turn more than 1.03x `prefix`'s; median TTFT
<= `--vs-prefix` x `prefix`'s (0.75 where prefix reuse leaves shifted segments to compute).

`--family NAME` keeps the turns of that workload family only, on both runs: the choice a user
who runs one kind of agent would make on its tuning sessions. Without it, every family of the
tuning run is pooled (one choice for all).

    python benchmarks/reuse/tuned_choice.py --tune docs/bench/generated/tune \
        --validate docs/bench/generated/validate --out docs/bench/generated/choice

Writes choice.md and choice.json to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.provenance import provenance
from agentcache.bench.reuse.planner.report import (
    PLANNER,
    Rates,
    by_turn,
    fastest_at_floor,
    meets,
    per_turn,
    rates,
    ratio,
)
from agentcache.bench.reuse.report import markdown_table
from agentcache.bench.stats import spread

WITHIN_ORACLE, WORST_VS_PREFIX = 1.05, 1.03

Turns = list[dict[str, dict[str, Any]]]


def load(folder: Path, split: str) -> dict[str, Any]:
    path = folder / "results.json"
    if not path.is_file():
        raise SystemExit(f"{folder}: no results.json")
    run: dict[str, Any] = json.loads(path.read_text())
    if run.get("split") != split:
        raise SystemExit(f"{folder}: a {run.get('split')!r} run, not {split!r}")
    return run


def pooled(runs: list[dict[str, Any]], family: str | None, folders: list[Path]) -> Turns:
    """The warm turns of every run, of workload `family` only when given (in any of them)."""
    known = sorted({str(r.get("workload")) for run in runs for r in run["turns"]})
    if family is not None and family not in known:
        names = ", ".join(map(str, folders))
        raise SystemExit(f"{names}: no turn of family {family!r}; they have {known}")
    turns: Turns = []
    for run in runs:
        keep = [r for r in run["turns"] if family is None or r.get("workload") == family]
        turns += list(by_turn(keep).values())
    return turns


def compute(turns: Turns, label: str) -> float:
    xs = [t[label]["recompute_fraction"] for t in turns if label in t]
    return statistics.fmean(xs) if xs else math.nan


def row(turns: Turns, label: str, floor: Rates) -> dict[str, Any]:
    g, f, kl, n = rates(turns, label)
    out: dict[str, Any] = {
        "label": label, "n": n, "greedy": g, "first": f, "tf_kl": kl,
        "compute": compute(turns, label), "meets": meets(turns, label, floor),
        "vs_full": spread(per_turn(turns, label, "full")),
    }  # fmt: skip
    if any("prefix" in t for t in turns):
        out["vs_prefix"] = spread(per_turn(turns, label, "prefix"))
    return out


def targets(
    turns: Turns, label: str, oracle: str | None, floor: Rates, vs_prefix: float
) -> dict[str, Any]:
    r = row(turns, label, floor)
    out: dict[str, Any] = {"floor": r["meets"]}
    if oracle is not None:
        out["vs_oracle"] = ratio(turns, label, oracle)
        out["within_oracle"] = out["vs_oracle"] <= WITHIN_ORACLE
    if "vs_prefix" in r:
        out["worst_vs_prefix"] = r["vs_prefix"]["max"]
        out["never_slower"] = r["vs_prefix"]["max"] <= WORST_VS_PREFIX
        out["vs_prefix"] = r["vs_prefix"]["median"]
        out["faster_than_prefix"] = r["vs_prefix"]["median"] <= vs_prefix
    return out


def render(choice: dict[str, Any]) -> str:
    floor = choice["floor"]
    family = choice.get("family")
    lines = [
        f"Tuning run(s): `{choice['tune']['command']}`",
        "",
        f"Turns read: family `{family}` only." if family else "Turns read: every family, pooled.",
        "",
        f"Validation run: `{choice['validate']['command']}`",
        "",
        f"Floor: greedy continuation equal to full's on >= {floor['greedy']:g} of warm turns, "
        f"first token on >= {floor['first']:g}. TTFT ratios: per warm turn, within one run; "
        "median (interquartile range, min-max).",
        "",
        "## The rule on the tuning run",
        "",
        f"Fastest strategy at the floor on the tuning run: **{choice['tuned'] or 'none'}**.",
        "",
    ]
    lines.append(_table(choice["tune"]["rows"]))
    lines += ["", "## On the validation run", ""]
    lines.append(_table(choice["validate"]["rows"], who=choice["validate"]["who"]))
    lines += ["", "Targets (the default and the planner, on the validation run):", ""]
    body = []
    for label, t in choice["validate"]["targets"].items():
        cells = [f"{t[k]:.3f}" if k in t else "-"
                 for k in ("vs_oracle", "worst_vs_prefix", "vs_prefix")]  # fmt: skip
        body.append([f"`{label}`", "met" if t["floor"] else "missed", *cells])
    lines.append(markdown_table(
        ["strategy", "floor", f"TTFT / oracle's (<= {WITHIN_ORACLE})",
         f"worst turn / prefix's (<= {WORST_VS_PREFIX})",
         f"TTFT / prefix's (<= {choice['vs_prefix_target']})"], body))  # fmt: skip
    return "\n".join(lines) + "\n"


def _table(rows: list[dict[str, Any]], who: dict[str, str] | None = None) -> str:
    names: dict[str, list[str]] = {}
    for role, label in (who or {}).items():
        names.setdefault(label, []).append(role)
    body = []
    for r in rows:
        p = r.get("vs_prefix")
        f = r["vs_full"]
        roles = f" ({', '.join(names[r['label']])})" if r["label"] in names else ""
        body.append([
            f"`{r['label']}`{roles}",
            str(r["n"]), f"{f['median']:.3f} ({f['q25']:.3f}-{f['q75']:.3f})",
            f"{p['median']:.3f} ({p['min']:.3f}-{p['max']:.3f})" if p else "-",
            f"{r['compute']:.3f}", f"{r['tf_kl']:.1e}", f"{r['greedy']:.2f}", f"{r['first']:.2f}",
            "yes" if r["meets"] else "no",
        ])  # fmt: skip
    return markdown_table(
        ["strategy", "n", "TTFT / full", "TTFT / prefix (min-max)", "compute", "KL tf",
         "greedy exact", "first token", "at the floor"], body)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tune", type=Path, nargs="+", required=True,
                   help="bench output folder(s) of the tuning run(s), pooled")  # fmt: skip
    p.add_argument("--validate", type=Path, required=True, help="bench output folder (validation)")
    p.add_argument("--vs-prefix", type=float, default=0.75, help="the speed target over prefix")
    p.add_argument("--family", help="keep this workload family's turns only (default: pooled)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    tunes, val = [load(t, "tune") for t in args.tune], load(args.validate, "validate")
    for tune in tunes:
        if tune["model"] != val["model"]:
            raise SystemExit(f"runs of two models: {tune['model']} and {val['model']}")
    floor = Rates()
    t_turns = pooled(tunes, args.family, args.tune)
    v_turns = pooled([val], args.family, [args.validate])
    tuned, oracle = fastest_at_floor(t_turns, floor), fastest_at_floor(v_turns, floor)
    default = val["default_strategy"]
    labels = sorted({s for t in v_turns for s in t})
    if tuned is not None and tuned not in labels:
        raise SystemExit(f"the validation run did not measure {tuned!r}, the tuning choice")
    who = {"default": default, "tuned": tuned, "oracle": oracle}
    if PLANNER in labels:
        who["plan"] = PLANNER
    who = {k: v for k, v in who.items() if v is not None}
    sessions = [*(s for t in tunes for s in t.get("sessions", [])), *val.get("sessions", [])]
    argv = ["--tune", *map(str, args.tune), "--validate", str(args.validate), "--vs-prefix",
            f"{args.vs_prefix:g}", "--out", str(args.out)]  # fmt: skip
    if args.family is not None:
        argv += ["--family", args.family]
    record = provenance(split="mixed", sessions=sessions, argv=argv,
                        script="benchmarks/reuse/tuned_choice.py")  # fmt: skip
    choice = {
        "provenance": record,
        "floor": {"greedy": floor.greedy, "first": floor.first},
        "vs_prefix_target": args.vs_prefix,
        "tuned": tuned,
        "family": args.family,
        "tune": {"command": " ; ".join(str(t.get("command")) for t in tunes),
                 "sessions": [s for t in tunes for s in t.get("sessions", [])],
                 "rows": [row(t_turns, s, floor) for s in sorted({s for t in t_turns for s in t})]},
        "validate": {
            "command": val.get("command"), "sessions": val.get("sessions"), "who": who,
            "rows": [row(v_turns, s, floor) for s in labels],
            "targets": {label: targets(v_turns, label, oracle, floor, args.vs_prefix)
                        for role, label in who.items() if role in ("default", "plan")},
        },
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    title = "# A fixed strategy chosen on tuning, read on validation\n\n"
    (args.out / "choice.md").write_text(title + render(choice))
    print((args.out / "choice.md").read_text())


if __name__ == "__main__":
    main()
