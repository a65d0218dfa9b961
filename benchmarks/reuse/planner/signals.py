"""Which predictor signals carry to sessions the fit never saw (tuning turns only), and why
`plan` keeps memgpt's turns exact (validation turns, read, not chosen on).

    python benchmarks/reuse/planner/signals.py --out docs/bench/planner/signals.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from calibration import LABELS
from fit import FAMILIES, runs

from agentcache.bench.reuse.planner.data import rows_from_runs
from agentcache.bench.reuse.planner.signals import cross_validate, render_cv, why_table
from agentcache.model.loading import load_model
from agentcache.reuse.planner.choice import Floor
from agentcache.reuse.planner.predictor import FEATURES, shipped_predictor

COMMAND = "python benchmarks/reuse/planner/signals.py --out docs/bench/planner/signals.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantile", type=float, default=0.9)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = load_model()
    predictor = shipped_predictor(model.model_id)
    if predictor is None:
        raise SystemExit(f"no shipped plan predictor for {model.model_id}")
    workloads = [Path(f"benchmarks/workloads/{f}.jsonl") for f in FAMILIES]
    tune, _ = rows_from_runs(model, runs(), workloads, "tune")
    held = [h for which in FEATURES for split in ("family", "session")
            for h in cross_validate(tune, which, split, args.quantile)]  # fmt: skip
    memgpt = [(Path("docs/bench/validate-memgpt"), LABELS)]
    val, _ = rows_from_runs(model, memgpt, workloads, "validate")
    b = predictor.floors["high"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    text = (
        "# Plan predictor signals: do they carry to unseen sessions?\n\n"
        f"Commit {commit}; `{COMMAND}`. Tuning runs: "
        f"{', '.join(str(r) for r, _ in runs())}; {len(tune)} plan-turns. Residual margin: "
        f"the {args.quantile:g} quantile. The `high` floor's bound is refitted in each fold "
        "on its training turns.\n\n"
        + render_cv(held)
        + "\n## memgpt validation turns under the shipped predictor\n\n"
        f"Floor `high`: predicted first-token and teacher-forced KL <= {b.first:.1e} / "
        f"{b.tf:.1e}. Stored run docs/bench/validate-memgpt (TTFTs of a shared machine).\n\n"
        + why_table(predictor, val, "memgpt", Floor("high", b.first, b.tf))
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
