"""The plan predictor's calibration on validation sessions, from stored validation runs of
the fixed plans (docs/bench/validate-*): predicted against measured KL, per family and plan.

    python benchmarks/planner_calibration.py --out docs/bench/planner/calibration.md
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentcache.bench.planner_calibration import calibrate, render
from agentcache.bench.planner_data import rows_from_runs
from agentcache.model.loading import load_model
from agentcache.reuse.planner.predictor import shipped_predictor

FAMILIES = ("memgpt", "reflexion", "swe_agent")
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
