"""Read the planner's model signal (agentcache/reuse/planner/attention.py) on every session
the fit and the calibration read: per warm turn, one fresh pass of the prompt through the
first `--layers` layers; per plan, the attention mass the last `--window` tokens pay the
changed tokens it leaves out. Per session one JSON file under `--out` (a session already
there is not read again).

    AGENTCACHE_NUM_THREADS=1 python benchmarks/reuse/planner/reads.py \\
        --out docs/bench/planner/attention-reads
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from fit import FAMILIES
from tqdm import tqdm

from agentcache.bench.reuse.planner.reads import cached_masses
from agentcache.model.loading import load_model
from agentcache.workload.files import load_workload

LAYERS, WINDOW = 4, 32


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument(
        "--split",
        choices=("tune", "validate", "all"),
        default="all",
        help="the sessions read (the cross-validation reads tune sessions only)",
    )
    p.add_argument(
        "--deviation",
        action="store_true",
        help="the attention-weighted key deviation of the left-out tokens instead",
    )
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(int(os.environ.get("AGENTCACHE_NUM_THREADS", "1")))
    model = load_model()
    sessions = [s for f in FAMILIES for s in load_workload(Path(f"benchmarks/workloads/{f}.jsonl"))
                .sessions]  # fmt: skip
    sessions = [s for s in sessions if args.split in ("all", s.split)]
    for s in tqdm(sessions, desc=f"reads ({args.layers} layers, window {args.window})"):
        with torch.inference_mode():
            cached_masses(model, s, args.layers, args.window, args.out, args.deviation)


if __name__ == "__main__":
    main()
