#!/usr/bin/env python3
"""How much faster many decoding agents can be than one, from the cost of the matrix products.

    python benchmarks/server/step_bound.py --rows 1 4 8 16 --threads 1 --repeats 30 \
        --out docs/bench/server/step-bound/smollm2-t1

A decode step of the embedded engine sends every running turn's row through the same matrix
products (q, k, v, o, gate, up and down of every layer, then the head; `runtime/batch_step.py`),
and a turn alone through the one-row step. This times exactly those products, `F.linear` over
the default model's own weights, for a call of R rows (R = 1: the one-row step; R > 1 in the
call sizes `call_rule` gives R decode rows), each R in turn within every repeat, so that ratios
are within one run. `bound(R) = R * t(1) / t(R)`: the aggregate decode tokens/s R agents could
reach against one alone were everything else in a step (attention over each row's own context,
sampling, scheduling, prefills) free. What `batch_decode.py` measures for the whole engine is
below it; a target above it is out of reach for an engine built on these products.

Per R: the median over repeats of a step's products (seconds) and of the per-repeat
`bound(R)`, with its range. Writes results.json (with provenance) and report.md under --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from agentcache.bench.provenance import provenance
from agentcache.bench.results import write_run
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.llama import LlamaForward
from agentcache.model.loading import load_model
from agentcache.runtime.batch_step import (
    batched_dense_step,
    call_rule,
    layer_matrices,
    one_step,
)
from agentcache.runtime.config import EngineConfig


def products(forward: LlamaForward) -> list[tuple[Tensor, Tensor | None]]:
    """Every matrix a decode row goes through, in step order, with its bias."""
    layers = [m for w in forward.weights.layers for m in layer_matrices(w)]
    return [*layers, (forward.weights.lm_head, None)]


Calls = dict[int, list[Tensor]]  # a matrix's input width -> each call's rows


def step_products(mats: list[tuple[Tensor, Tensor | None]], calls: Calls) -> float:
    """Seconds for one step's products, each call's rows through every matrix."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        for w, b in mats:
            for x in calls[w.shape[1]]:
                F.linear(x, w, b)
    return time.perf_counter() - t0


def contexts(forward: LlamaForward, count: int, tokens: int, room: int) -> list[SequenceKV]:
    """`count` sequences of `tokens` tokens of random K/V each (a step's cost does not depend
    on the values), with pages for `room` more, each sequence on pages of its own in order."""
    c, page = forward.config, EngineConfig().page_size  # the engine's pages
    per = -(-(tokens + room) // page)
    pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, count * per, page))
    g = torch.Generator().manual_seed(1)
    seqs = []
    for _ in range(count):
        seq = SequenceKV(pool)
        seq.reserve(per)  # every page now, one run of slots, as the engine admits a turn
        slots = seq.extend(tokens)
        kv = torch.randn(2, c.num_layers, tokens, c.num_kv_heads, c.head_dim, generator=g)
        seq.write_all(slots, kv[0].to(pool.keys.dtype), kv[1].to(pool.keys.dtype))
        seqs.append(seq)
    return seqs


def whole_step(forward: LlamaForward, seqs: list[SequenceKV]) -> float:
    """Seconds for one decode step of `seqs` as the engine runs it: `one_step` for one
    sequence, else `batched_dense_step` (each sequence one token longer after it)."""
    positions = [s.num_tokens for s in seqs]
    tokens = [7] * len(seqs)
    t0 = time.perf_counter()
    with torch.inference_mode():
        if len(seqs) == 1:
            one_step(forward, seqs[0], tokens[0], positions[0])
        else:
            slots = torch.cat([s.extend(1) for s in seqs])
            batched_dense_step(forward, seqs, slots, tokens, positions)
    return time.perf_counter() - t0


def measure(forward: LlamaForward, rows: list[int], repeats: int, context: int) -> dict[str, Any]:
    mats = products(forward)
    rule = call_rule(forward)
    widths = sorted({w.shape[1] for w, _ in mats})
    dtype = mats[0][0].dtype
    g = torch.Generator().manual_seed(0)
    sizes = {r: [1] if r == 1 else rule.calls(r) for r in rows}
    inputs: dict[int, Calls] = {
        r: {d: [torch.randn(n, d, generator=g).to(dtype) for n in sizes[r]] for d in widths}
        for r in rows
    }
    seqs = {r: contexts(forward, r, context, repeats + 1) for r in rows}
    for r in rows:  # warm-up: kernels chosen, caches filled
        step_products(mats, inputs[r])
        whole_step(forward, seqs[r])
    seconds: dict[int, list[float]] = {r: [] for r in rows}
    steps: dict[int, list[float]] = {r: [] for r in rows}
    for _ in tqdm(range(repeats), desc="repeats"):
        for r in rows:
            seconds[r].append(step_products(mats, inputs[r]))
            steps[r].append(whole_step(forward, seqs[r]))

    def speedups(times: dict[int, list[float]], r: int) -> list[float]:
        return [r * one / t for one, t in zip(times[1], times[r], strict=True)]

    summary = {}
    for r in rows:
        bound, step = speedups(seconds, r), speedups(steps, r)
        summary[str(r)] = {
            "products_s": statistics.median(seconds[r]),
            "bound": statistics.median(bound),
            "bound_min": min(bound),
            "bound_max": max(bound),
            "step_s": statistics.median(steps[r]),
            "step_speedup": statistics.median(step),
            "step_speedup_min": min(step),
            "step_speedup_max": max(step),
        }
    return {
        "rule": {"block": rule.block, "cap": rule.cap, "floor": rule.floor},
        "calls": {str(r): sizes[r] for r in rows},
        "products_s": {str(r): seconds[r] for r in rows},
        "step_s": {str(r): steps[r] for r in rows},
        "summary": summary,
    }


def report(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [
        "# Matrix products of a decode step: the bound on many agents against one",
        "",
        f"Command: `{results['provenance']['command']}` (commit "
        f"{results['provenance']['commit']}).",
        "",
        f"Model `{results['model']}`, {results['threads']} torch thread(s), "
        f"{results['repeats']} repeats, every row count in turn within each repeat. Call rule "
        f"on this CPU: rows padded to a multiple of {results['rule']['block']}, calls of "
        f"{max(results['rule'].get('floor', 0), results['rule']['block'])} to "
        f"{results['rule']['cap']} rows. bound(R) = R * t(1) / t(R) of the products alone; "
        f"the whole step's R * t(1) / t(R) beside it (each row's context {results['context']} "
        "tokens and one more per step: attention included). Per repeat; medians over repeats, "
        "range after.",
        "",
        "| rows R | calls | products (median) | bound(R) | range | whole step (median) | "
        "R x one-row step / step | range |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, v in s.items():
        calls = "+".join(str(n) for n in results["calls"][r])
        lines.append(
            f"| {r} | {calls} | {v['products_s'] * 1e3:.1f} ms | {v['bound']:.2f}x | "
            f"{v['bound_min']:.2f}-{v['bound_max']:.2f} | {v['step_s'] * 1e3:.1f} ms | "
            f"{v['step_speedup']:.2f}x | {v['step_speedup_min']:.2f}-{v['step_speedup_max']:.2f} |"
        )
    lines += ["", "Every timing is in results.json."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--context", type=int, default=128, help="tokens of each row's context")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if 1 not in args.rows or min(args.rows) < 1 or args.repeats < 1 or args.context < 1:
        ap.error("--rows needs 1 (the reference) and counts >= 1; --repeats, --context >= 1")
    torch.set_num_threads(args.threads)
    origin = provenance(script="benchmarks/server/step_bound.py")
    model = load_model(None)
    rows = sorted(set(args.rows))
    results = {
        "provenance": origin,
        "model": model.model_id,
        "threads": args.threads,
        "repeats": args.repeats,
        "context": args.context,
        **measure(model.forward, rows, args.repeats, args.context),
    }
    print(write_run(args.out, results, report), end="")


if __name__ == "__main__":
    main()
