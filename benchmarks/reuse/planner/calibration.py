"""The plan predictor's calibration on validation sessions, from stored validation runs of
the fixed plans (docs/bench/validate-*): predicted against measured KL, per family and plan.

    python benchmarks/reuse/planner/calibration.py --out docs/bench/planner/calibration.md
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.planner.calibration import (
    calibrate,
    cost_calibration,
    render,
    render_cost,
    replay_choices,
)
from agentcache.bench.reuse.planner.data import PlanRow, rows_from_runs
from agentcache.bench.reuse.report import markdown_table
from agentcache.model.loading import load_model
from agentcache.reuse.planner.choice import Floor
from agentcache.reuse.planner.predictor import Predictor, shipped_predictor

FAMILIES = ("memgpt", "reflexion", "swe_agent")
COMPARED = ("rpdc", "epic", "prefix")  # the default, the tuning-chosen fixed plan, prefix
LABELS = {"pic": "pic", "epic": "epic", "rpdc:cover=0": "probe", "prefix": "prefix"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model()
    predictor = shipped_predictor(model.model_id)
    if predictor is None:
        raise SystemExit(f"no shipped plan predictor for {model.model_id}")
    runs = [(Path(f"docs/bench/validate-{f}"), LABELS) for f in FAMILIES]
    workloads = [Path(f"benchmarks/workloads/{f}.jsonl") for f in FAMILIES]
    rows, dropped = rows_from_runs(model, runs, workloads, "validate")
    text = (
        "# Plan predictor calibration on validation sessions\n\n"
        "Predicted (conservative) against measured KL of the fixed plans' stored runs, per "
        "family and plan; covered: share of turns whose measured KL is at most the "
        f"prediction.\n\nRuns: {', '.join(str(r) for r, _ in runs)}; "
        f"{len(rows)} plan-turns ({dropped} dropped: prompt length differs from the workload "
        f"file's). Margin: the {predictor.quantile:g} quantile of tuning residuals.\n\n"
        + render(calibrate(predictor, rows))
    )
    text += (
        "\n## Cost: the plans' work against their measured TTFT\n\n"
        "The planner's cost of a plan is its work over full's (the cost guard's units: "
        "token-layers, attention pairs, loads, a probe pass), not fitted. Against the stored "
        "runs' TTFT over full's on the same turns (those runs' machine load and code "
        "included):\n\n" + render_cost(cost_calibration(rows))
    )
    text += replay_table(predictor, rows, runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


def replay_table(predictor: Predictor, rows: list[PlanRow], runs: list[tuple[Path, Any]]) -> str:
    """`plan` (fidelity=high and balanced) replayed on the stored turns, beside the runs'
    fixed strategies (TTFT over full's: median of per-turn ratios over the same warm turns)."""
    fixed = {}
    for folder, _ in runs:
        run = json.loads((folder / "results.json").read_text())
        fixed[run["turns"][0]["workload"]] = run["strategies"]
    head = ["family", "floor", "turns", "plans chosen", "exact stand-ins", "greedy", "first tok",
            "plan TTFT/full", *[f"{s} TTFT/full (greedy)" for s in COMPARED]]  # fmt: skip
    body = []
    picks = []
    for name in ("high", "balanced"):
        b = predictor.floors[name]
        floor = Floor(name, b.first, b.tf)
        picks += [c | {"floor": name} for c in replay_choices(predictor, rows, floor, 0.02)]
    for c in sorted(picks, key=lambda c: c["family"]):
        f = fixed[c["family"]]
        body.append([c["family"], c["floor"], str(c["turns"]),
                     ", ".join(f"{k} {v}" for k, v in c["plans"].items()), str(c["stand_ins"]),
                     f"{c['greedy']:.2f}", f"{c['first']:.2f}", f"{c['vs_full']:.3f}",
                     *[f"{f[s]['ttft_ratio_vs_full']:.3f} ({f[s]['greedy_exact_match']:.2f})"
                       for s in COMPARED]])  # fmt: skip
    return (
        "\n## `plan` replayed on the same stored turns\n\n"
        "Each warm turn's choice (fidelity=high, balanced) judged by the stored record of the "
        "chosen plan's strategy in the same run; `exact` choices, which no stored run "
        "measured, take prefix's record (exact too; TTFT may differ): counted as stand-ins. "
        "Planning time is not in these TTFTs. A replay, not a run: the live run is in "
        "report.md.\n\n" + markdown_table(head, body) + "\n"
    )


if __name__ == "__main__":
    main()
