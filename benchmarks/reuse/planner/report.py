"""The planner's report from bench runs that include `plan` (docs/bench/planner/).

Per family: the planner against the best fixed strategy of the run that meets the floor
(chosen after seeing the results: an oracle bound) and against the fixed plan the predictor
file names as best on tuning data; plans chosen; calibration on the planner's approximate
turns.

    python benchmarks/reuse/planner/report.py /tmp/planner/validate-reflexion \
        --out docs/bench/planner/report.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentcache.bench.reuse.planner.report import Rates, render
from agentcache.reuse.planner.candidates import CANDIDATES
from agentcache.reuse.planner.predictor import shipped_predictor
from agentcache.reuse.spec import StrategySpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="bench output folders")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    records, commands, models = [], [], set()
    for folder in args.runs:
        run = json.loads((folder / "results.json").read_text())
        if run.get("split") != "validate":
            raise SystemExit(f"{folder}: not a validation run (split {run.get('split')!r})")
        records += run["turns"]
        commands.append(run.get("command", "?"))
        models.add(run["model"])
    if len(models) != 1:
        raise SystemExit(f"runs of several models: {sorted(models)}")
    predictor = shipped_predictor(models.pop())
    tuned_plan = predictor.fitted_on.get("best_fixed", {}).get("high") if predictor else None
    tuned = StrategySpec.parse(CANDIDATES[tuned_plan].spec).label if tuned_plan else None
    head = [
        "# The planner on validation sessions",
        "",
        "Runs:",
        "",
        *[f"- `{c}`" for c in commands],
        "",
        f"Best fixed plan on tuning data (`high` floor): `{tuned_plan}` (`{tuned}`).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head) + render(records, tuned, Rates()))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
