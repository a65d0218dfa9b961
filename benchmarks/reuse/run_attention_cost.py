"""What one layer's attention costs when the queries are the last T of S tokens (a prefill
behind a reused prefix of a tokens), against `full`'s causal call over all S: the run-split
path's two ways (`model/run_attention.py`: padded, split) forced in turn, interleaved per rep.

CPU time of this process (`time.process_time`), one thread by default, so that a shared
machine's other load shows as little as it can; the default model's attention shapes (9 query
heads, 3 KV heads, head dim 64).

    PYTHONPATH=. nice -n -5 .venv/bin/python benchmarks/reuse/run_attention_cost.py \\
        --context 3000 --prefix 16,64,256,1000 --reps 7 --out docs/bench/long-prompts/attention
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import agentcache.model.run_attention as ra
from agentcache.bench.provenance import load_average, provenance
from agentcache.bench.results import write_run
from agentcache.model.attention import attention

WAYS = {"padded": 10**12, "split": -1}  # PAD_PAIRS_PER_ROW forcing each way


def cpu_s(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(s: int, a: int, reps: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(a)
    q, k, v = (torch.randn(s, h, 64, generator=g) for h in (9, 3, 3))
    idx, scale = torch.arange(a, s), 64**-0.5
    times: dict[str, list[float]] = {"full": [], **{w: [] for w in WAYS}}
    for _ in range(reps):
        times["full"].append(cpu_s(lambda: attention(q, k, v, None, scale)))
        for way, pad in WAYS.items():
            ra.PAD_PAIRS_PER_ROW = pad
            times[way].append(cpu_s(lambda: attention(q[a:], k, v, idx, scale)))
    ra.PAD_PAIRS_PER_ROW = PAD
    ratios = {w: [x / f for x, f in zip(times[w], times["full"], strict=True)] for w in WAYS}
    return {
        "context": s, "prefix": a, "reps": reps,
        "full_ms": statistics.median(times["full"]) * 1e3,
        **{f"{w}_vs_full": statistics.median(r) for w, r in ratios.items()},
        **{f"{w}_vs_full_range": [min(r), max(r)] for w, r in ratios.items()},
        "chosen": "padded" if ra.QueryRun(0, s - a, a, s).padded else "split",
    }  # fmt: skip


PAD = ra.PAD_PAIRS_PER_ROW


def report(results: dict[str, Any]) -> str:
    p = results["provenance"]
    lines = [
        "# One layer's attention behind a reused prefix: padded and split runs against `full`",
        "",
        f"Command: `{p['command']}`  ",
        f"Commit {p['commit']}, {p['date']}, {p['machine']}, load average "
        f"{results['load_average']}.",
        "",
        "CPU time / `full`'s causal call over the whole context, median [min-max] over reps.",
        "",
        "| context | prefix a | full ms | padded / full | split / full | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        cells = " | ".join(
            f"{r[f'{w}_vs_full']:.3f} [{r[f'{w}_vs_full_range'][0]:.3f}-"
            f"{r[f'{w}_vs_full_range'][1]:.3f}]"
            for w in WAYS
        )
        lines.append(
            f"| {r['context']} | {r['prefix']} | {r['full_ms']:.0f} | {cells} | {r['chosen']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=3000)
    p.add_argument("--prefix", default="16,64,256,1000", help="reused prefix lengths a")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    with torch.inference_mode():
        rows = [measure(a.context, int(x), a.reps) for x in a.prefix.split(",")]
    prov = provenance(argv=argv, script="benchmarks/reuse/run_attention_cost.py")
    write_run(a.out, {"provenance": prov, "load_average": load_average(), "rows": rows}, report)


if __name__ == "__main__":
    main()
