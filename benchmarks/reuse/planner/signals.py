"""Which predictor signals carry to sessions the fit never saw (tuning turns only), and why
`plan` keeps memgpt's turns exact (validation turns, read, not chosen on).

The `attn` feature set reads the model signal stored by reads.py (`--reads`; a session not
there is read now, at 1 thread) and is judged at every layer read.

    python benchmarks/reuse/planner/signals.py --out docs/bench/planner/signals.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import torch
from calibration import LABELS
from fit import FAMILIES, runs
from reads import LAYERS, WINDOW

from agentcache.bench.reuse.planner.data import PlanRow, rows_from_runs
from agentcache.bench.reuse.planner.reads import cached_masses, with_read
from agentcache.bench.reuse.planner.signals import (
    Held,
    cross_validate,
    render_cv,
    render_residuals,
    residuals,
    why_table,
)
from agentcache.model.loading import LoadedModel, load_model
from agentcache.reuse.planner.choice import Floor
from agentcache.reuse.planner.predictor import FEATURES, MODEL_READ, shipped_predictor
from agentcache.workload.files import load_workload

COMMAND = "python benchmarks/reuse/planner/signals.py --out docs/bench/planner/signals.md"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument("--reads", type=Path, default=Path("docs/bench/planner/attention-reads"))
    p.add_argument(
        "--deviation-reads", type=Path, default=Path("docs/bench/planner/deviation-reads")
    )
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(int(os.environ.get("AGENTCACHE_NUM_THREADS", "1")))
    model = load_model()
    predictor = shipped_predictor(model.model_id)
    if predictor is None:
        raise SystemExit(f"no shipped plan predictor for {model.model_id}")
    workloads = [Path(f"benchmarks/workloads/{f}.jsonl") for f in FAMILIES]
    tune, _ = rows_from_runs(model, runs(), workloads, "tune")
    labelled = [(which, which, tune) for which in FEATURES if which not in MODEL_READ]
    for which, reads, first in (("attn", args.reads, 0), ("dev", args.deviation_reads, 1)):
        rows_by_layer = read_rows(model, tune, reads, which == "dev")
        labelled += [(f"{which} L{first + i}", which, rows) for i, rows in enumerate(rows_by_layer)]
    held = [h for label, which, rows in labelled for split in ("family", "session")
            for h in cv(rows, which, split, args.quantile, label)]  # fmt: skip
    spread = [x for label, which, rows in labelled for x in residuals(rows, which, label)]
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
        "Read from the model (benchmarks/reuse/planner/reads.py, agentcache/reuse/planner/"
        f"attention.py): per warm turn, a fresh pass of the prompt through the first {LAYERS} "
        f"layers; the attention the last {WINDOW} prompt tokens pay each token (mean over "
        "heads and those queries). `attn Ll`: base + log10 of the mass the plan's left-out "
        f"tokens receive at layer l ({args.reads}). `dev Ll`: base + log10 of that mass "
        "weighted by each left-out token's key deviation at layer l, ||k - k(stored)||^2 / "
        "||k||^2, the stored copy's keys those of the turn that first stored its segment "
        f"({args.deviation_reads}; layer 0's keys see no context). A probe plan's left-out "
        "tokens are the pool tokens outside its budget when ranked by the read's own max "
        "attention over layers 1.. (rpdc ranks by its probe over the cached KV instead). "
        "log10 pred/meas: the median over the family's plans and both KLs of the median "
        "log10(predicted / measured) on held-out turns (how conservative).\n\n"
        + render_cv(held)
        + "\n## What the features leave unexplained (in sample)\n\n"
        "Per plan, the KL fit (least squares, no margin) on every tuning turn of every family; "
        "the residuals' standard deviation and their mean per family, in decades, medians "
        "over the plans. A feature set that explains the families' difference brings the "
        "family means near 0.\n\n"
        + render_residuals(spread)
        + "\n## memgpt validation turns under the shipped predictor\n\n"
        f"Floor `high`: predicted first-token and teacher-forced KL <= {b.first:.1e} / "
        f"{b.tf:.1e}. Stored run docs/bench/validate-memgpt (TTFTs of a shared machine).\n\n"
        + why_table(predictor, val, "memgpt", Floor("high", b.first, b.tf))
    )
    args.out.write_text(text)
    print(text)


def cv(rows: list[PlanRow], which: str, split: str, quantile: float,
       label: str) -> list[Held]:  # fmt: skip
    return [replace(h, features=label) for h in cross_validate(rows, which, split, quantile)]


def read_rows(model: LoadedModel, rows: list[PlanRow], reads: Path,
              deviation: bool) -> list[list[PlanRow]]:  # fmt: skip
    """`rows` with each layer's read (one list per layer): the attention mass, or with
    `deviation` the deviation-weighted mass (layers 1.., layer 0's keys see no context)."""
    sessions = {r.session for r in rows}
    values = {}
    for f in sorted({r.family for r in rows}):
        for s in load_workload(Path(f"benchmarks/workloads/{f}.jsonl")).sessions:
            if s.name in sessions:
                with torch.inference_mode():
                    values[s.name] = cached_masses(model, s, LAYERS, WINDOW, reads, deviation)
    field, first = ("dev", 1) if deviation else ("attn", 0)
    return [with_read(rows, values, layer, field) for layer in range(first, LAYERS)]


if __name__ == "__main__":
    main()
