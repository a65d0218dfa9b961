"""The embedded default model's forward and dense decode, two source trees side by side.

Each round runs one process per tree, in alternating order, on the same prompt: a dense
forward of `--prompt` tokens and `--steps` dense decode steps over the page pool (`dense_step`,
the engine's decode). Each process reports the median of `--repeats` timings and saves its
logits, so the trees are compared for identical outputs (bit for bit) and speed (ratio of
medians per round). Each tree is a snapshot of one commit, so edits made while it runs do not
leak in. `--warmup N` runs N untimed forwards and a decode step first, so that no timed
repeat pays the process's one-off setup. Usage:

    for c in BASE NEW; do mkdir -p /tmp/$c && git archive $c agentcache | tar -x -C /tmp/$c; done
    python benchmarks/decode/family_seam_speed.py --base /tmp/BASE --new /tmp/NEW \\
        --note "BASE -> NEW" --out docs/bench/model/family_seam_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = r"""
import json, statistics, sys, time
import torch
from agentcache.decode.dense import dense_step
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.loading import load_model

prompt, steps, repeats, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
warmup = int(sys.argv[5])
torch.set_num_threads(1)
m = load_model()
f, c = m.forward, m.config
ids = torch.randint(0, c.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
fwd_s, dec_s = [], []
with torch.inference_mode():
    for _ in range(warmup):  # untimed: the process's first calls pay one-off setup
        f.forward(ids)
        warm = SequenceKV(PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 64)))
        dense_step(f, warm, 0, 0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = f.forward(ids)
        fwd_s.append(time.perf_counter() - t0)
        pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 64))
        seq = SequenceKV(pool)
        slots = seq.extend(prompt)
        pool.keys[:, slots] = ref.keys
        pool.values[:, slots] = ref.values
        token, logits = int(ref.logits[-1].argmax()), []
        t0 = time.perf_counter()
        for i in range(steps):
            step = dense_step(f, seq, token, prompt + i)
            logits.append(step)
            token = int(step.argmax())
        dec_s.append(time.perf_counter() - t0)
torch.save({"forward": ref.logits, "decode": torch.stack(logits)}, out + ".pt")
json.dump({"forward_s": statistics.median(fwd_s), "decode_s": statistics.median(dec_s)},
          open(out, "w"))
"""


def run(tree: Path, args: argparse.Namespace, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-c", CHILD, str(args.prompt), str(args.steps), str(args.repeats)]
    subprocess.run([*argv, str(out), str(args.warmup)], env=env, check=True, cwd=tree)
    return dict(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed forwards (and a decode step) before the timed repeats",
    )
    ap.add_argument("--note", default="", help="what the trees are (their commits)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from agentcache.bench.provenance import load_average, provenance

    load_start = load_average()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("base", "new") if r % 2 == 0 else ("new", "base")
            got = {}
            for name in order:
                got[name] = run(getattr(args, name).resolve(), args, Path(tmp) / f"{name}{r}")
            a, b = (torch.load(Path(tmp) / f"{n}{r}.pt") for n in ("base", "new"))
            same = all(torch.equal(a[k], b[k]) for k in ("forward", "decode"))
            rows.append({"round": r, "order": order, **{f"{n}_{k}": v for n, d in got.items()
                         for k, v in d.items()}, "identical": same})  # fmt: skip
    ratios = {k: [row[f"new_{k}"] / row[f"base_{k}"] for row in rows]
              for k in ("forward_s", "decode_s")}  # fmt: skip
    summary = {
        k: {"median_ratio": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
        for k, v in ratios.items()
    }
    record = provenance(script="benchmarks/decode/family_seam_speed.py")
    load = {"start": load_start, "end": load_average()}  # 1, 5, 15 min
    report = {"provenance": record, "load_average": load,
              "args": {k: str(v) for k, v in vars(args).items()}, "rounds": rows,
              "new_over_base": summary, "identical": all(r["identical"] for r in rows)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"new_over_base": summary, "identical": report["identical"], "load": load},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
