"""Fit the plan predictor (agentcache/reuse/planner) on tuning sessions' stored bench runs.

Each run folder's labels are mapped to the planner's plans (the fixed strategy each plan
runs); only the workload files' tuning sessions are read. The signals of each turn are
replayed from store metadata (agentcache/bench/reuse/planner/data.py), so the fit needs the
tokenizer, not a model run.

    python benchmarks/reuse/planner/fit.py --out agentcache/reuse/planner/data/smollm2-135m.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from agentcache.bench.reuse.planner.data import rows_from_runs
from agentcache.bench.reuse.planner.fit import fit_predictor
from agentcache.model.loading import load_model

FAMILIES = ("memgpt", "reflexion", "swe_agent")


def runs() -> list[tuple[Path, dict[str, str]]]:
    """Stored runs holding tuning sessions, and which plan each of their labels ran."""
    b = Path("docs/bench")
    out = []
    for f in FAMILIES:
        out.append((b / f, {"pic": "pic", "epic": "epic", "prefix": "prefix"}))
        out.append((b / f"wide-budget-{f}", {"epic": "epic", "rpdc:extra=0.5": "probe5"}))
        out.append((b / f"wide-{f}", {"pic": "pic"}))
        # taken when rpdc's default had no cover: the `probe` plan (rpdc:cover=0)
        out.append((b / "tune-cover" / f, {"rpdc": "probe", "prefix": "prefix"}))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantile", type=float, default=0.9, help="residual quantile (margin)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model()
    workloads = [Path(f"benchmarks/workloads/{f}.jsonl") for f in FAMILIES]
    rows, dropped = rows_from_runs(model, runs(), workloads, "tune")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    fitted_on = {
        "split": "tune", "runs": [str(r) for r, _ in runs()], "turns": len(rows),
        "dropped_length_mismatch": dropped, "commit": commit.strip(),
        "sessions": sorted({r.session for r in rows}),
        "command": "python benchmarks/reuse/planner/fit.py --out " + str(args.out),
    }  # fmt: skip
    predictor = fit_predictor(model.model_id, rows, args.quantile, fitted_on)
    predictor.save(args.out)
    print(f"{len(rows)} plan-turns ({dropped} dropped) -> {args.out}")


if __name__ == "__main__":
    main()
