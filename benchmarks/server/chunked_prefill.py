#!/usr/bin/env python3
"""A decoding turn beside a long prefill: chunked prefill in the batch against whole prefills.

    nice -n 19 python benchmarks/server/chunked_prefill.py --repeats 5 \
        --out docs/bench/server/chunked-prefill/smollm2-2k

On one embedded engine per configuration (default model, `full` prefill, greedy, batched
decode, nothing committed), turn A decodes `--new-tokens` tokens from a short prompt; once it
has `--head` tokens, turn B sends a long prompt (`--prompt-tokens` or so) and takes one token:

    whole     EngineConfig(prefill_chunk_tokens=0): B's prefill runs as one unit; A waits
    chunked   EngineConfig(prefill_chunk_tokens=--chunk): B's prefill runs --chunk tokens per
              step, each step also decoding A

Per run: A's largest gap between two tokens (the stall B's prefill causes it) and its median
gap, B's time to first token (what chunking costs the long prompt), the steps that ran a chunk
and decoded A (counted by the scheduler). Configurations alternate which runs first; the
statistics are medians over repeats of the per-repeat ratios chunked / whole, with their range.
Greedy ids of A and B are compared between the configurations in each repeat. Writes
results.json (with provenance) and report.md under --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.provenance import provenance
from agentcache.bench.results import write_run
from agentcache.model.loading import load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

SYSTEM = "You are Forge, a software maintenance agent. Read before you edit; test every change."
LOG = "2026-12-04 10:{m:02d}:{s:02d} INFO worker {w} finished job {j} in {t} ms, queue depth {d}.\n"


def short_prompt() -> SegmentedPrompt:
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system"),
                            Segment(SegmentKind.UPDATE, "Describe how you would find why the "
                                    "cache never expires entries.", "u", "user")])  # fmt: skip


def long_prompt(engine: Engine, tokens: int) -> SegmentedPrompt:
    """A tool result of log lines, grown until the prompt holds about `tokens` tokens."""
    lines: list[str] = []
    while True:
        i = len(lines)
        lines.append(LOG.format(m=i // 60 % 60, s=i % 60, w=i % 7, j=1000 + i, t=37 * i % 900,
                                d=i % 13))  # fmt: skip
        p = SegmentedPrompt([
            Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system"),
            Segment(SegmentKind.UPDATE, "Which worker is slowest?\n" + "".join(lines), "u",
                    "user"),
        ])  # fmt: skip
        if len(lines) % 8 == 0 and engine.tokenize(p).num_tokens >= tokens:
            return p


def run(e: Engine, long: SegmentedPrompt, new_tokens: int, head: int) -> dict[str, Any]:
    """A decodes; after its `head`-th token B prefills `long`. A's token times, B's TTFT."""
    assert e.batch is not None
    before = e.batch.stats()
    stamps: list[float] = []
    started = threading.Event()
    out: dict[str, Any] = {}

    def on_token(_: int) -> None:
        stamps.append(time.perf_counter())
        if len(stamps) == head:
            started.set()

    def turn_a() -> None:
        params = GenerationParams(max_new_tokens=new_tokens)
        out["a"] = e.generate(short_prompt(), params, "full", commit=False, on_token=on_token)

    def turn_b() -> None:
        started.wait()
        out["b"] = e.generate(long, GenerationParams(max_new_tokens=1), "full", commit=False)

    threads = [threading.Thread(target=turn_a), threading.Thread(target=turn_b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    after = e.batch.stats()
    return {
        "a_max_gap_s": max(gaps), "a_median_gap_s": statistics.median(gaps),
        "a_tokens": len(stamps), "b_ttft_s": out["b"].stats.ttft_s,
        "b_prompt_tokens": e.tokenize(long).num_tokens,
        "chunks": after.prefill_chunks - before.prefill_chunks,
        "mixed_steps": after.mixed_steps - before.mixed_steps,
        "a_ids": list(out["a"].token_ids), "b_ids": list(out["b"].token_ids),
    }  # fmt: skip


def summarize(runs: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Per repeat, chunked / whole of A's largest gap, A's median gap and B's TTFT; medians and
    ranges over repeats; whether the greedy ids agreed in every repeat."""
    by = {(r["repeat"], r["config"]): r for r in runs}
    out: dict[str, Any] = {"repeats": repeats}
    for key in ("a_max_gap_s", "a_median_gap_s", "b_ttft_s"):
        ratios = [by[k, "chunked"][key] / by[k, "whole"][key] for k in range(repeats)]
        out[f"{key}_ratio"] = {"median": statistics.median(ratios), "min": min(ratios),
                               "max": max(ratios), "n": len(ratios)}  # fmt: skip
        for c in ("whole", "chunked"):
            vals = [by[k, c][key] for k in range(repeats)]
            out[f"{key}_{c}"] = {"median": statistics.median(vals), "min": min(vals),
                                 "max": max(vals)}  # fmt: skip
    out["ids_agree"] = all(
        by[k, "chunked"]["a_ids"] == by[k, "whole"]["a_ids"]
        and by[k, "chunked"]["b_ids"] == by[k, "whole"]["b_ids"]
        for k in range(repeats)
    )
    return out


def report(results: dict[str, Any]) -> str:
    s, st = results["summary"], results["settings"]
    rows = [f"# Chunked prefill beside a decoding turn\n\n`{results['provenance']['command']}`\n",
            f"B's prompt: {results['runs'][0]['b_prompt_tokens']} tokens; chunk "
            f"{st['chunk']} tokens; A decodes {st['new_tokens']} tokens; {s['repeats']} "
            "repeats, order alternating. Ratios chunked / whole per repeat: median (range).\n",
            "| quantity | whole, median | chunked, median | chunked / whole |",
            "|---|---|---|---|"]  # fmt: skip
    for key, what in (("a_max_gap_s", "A's largest gap between tokens (s)"),
                      ("a_median_gap_s", "A's median gap (s)"),
                      ("b_ttft_s", "B's time to first token (s)")):  # fmt: skip
        r = s[f"{key}_ratio"]
        rows.append(f"| {what} | {s[f'{key}_whole']['median']:.3f} | "
                    f"{s[f'{key}_chunked']['median']:.3f} | {r['median']:.3f} "
                    f"({r['min']:.3f}-{r['max']:.3f}) |")  # fmt: skip
    rows.append(f"\nGreedy ids of A and B equal between the configurations in every repeat: "
                f"{s['ids_agree']}.\n")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--head", type=int, default=8, help="A's tokens before B is sent")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    origin = provenance(script="benchmarks/server/chunked_prefill.py")
    model = load_model(None)
    engines = {}
    for c, chunk in (("whole", 0), ("chunked", args.chunk)):
        config = EngineConfig(
            strategy="full", kv_pages=1024, batch_decode=True, prefill_chunk_tokens=chunk
        )
        engines[c] = Engine(model, config)
    long = long_prompt(engines["whole"], args.prompt_tokens)
    runs = []
    for rep in range(args.repeats):
        order = list(engines.items())
        for c, e in order if rep % 2 == 0 else order[::-1]:  # which runs first alternates
            r = run(e, long, args.new_tokens, args.head)
            r |= {"repeat": rep, "config": c, "load_avg": os.getloadavg()[0]}
            runs.append(r)
            print(f"rep {rep} {c:7s} A max gap {r['a_max_gap_s']:.3f}s median "
                  f"{r['a_median_gap_s']:.3f}s  B ttft {r['b_ttft_s']:.3f}s  chunks "
                  f"{r['chunks']} mixed {r['mixed_steps']}  load {r['load_avg']:.2f}",
                  flush=True)  # fmt: skip
    results = {
        "provenance": origin,
        "settings": vars(args) | {"out": str(args.out), "model": model.model_id,
                                  "strategy": "full", "greedy": True},
        "summary": summarize(runs, args.repeats),
        "runs": runs,
    }  # fmt: skip
    write_run(args.out, results, report)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
