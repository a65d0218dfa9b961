#!/usr/bin/env python3
"""Concurrent decoding agents on one embedded engine: batched decode against interleaved.

    nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
        --repeats 3 --out docs/bench/server/batching/smollm2-48

N agents (threads) send their prompts at once to one engine (default model, `full` prefill,
greedy, nothing committed); each engine configuration in turn, repeat by repeat, so that ratios
are within one run:

    interleaved   EngineConfig(batch_decode=False): each turn steps alone, token by token
    batched       EngineConfig(batch_decode=True): one step feeds every running turn
    batched@B     ... with prefill_burst_tokens=B (--bursts): waiting prefills run back to
                  back between two steps while their tokens fit in B

Per run: aggregate decode tokens/s (tokens generated / wall time from the common start to the
last reply, prefills included), each agent's time to first token and its decode tokens/s
(`TurnStats.decode_tokens_per_s`, prefill excluded: with one agent, the lone request's decode
speed batched against interleaved, paired within each repeat), and the process's CPU seconds
(`time.process_time`: tokens per CPU second is what the engine's work costs, which other jobs
on a shared machine slow less than they slow the wall clock). Agent i's prompt is the
same at every N, so its greedy ids are compared with its run alone (the smallest N that ran it:
N = 1 for agent 0) and with the interleaved engine's in the same repeat, where each turn steps
on its own (the reference step). Writes results.json (with provenance) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.provenance import provenance, provenance_line
from agentcache.bench.results import write_run
from agentcache.bench.server.at_once import generate_at_once, with_cpu_time
from agentcache.model.loading import load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

SYSTEM = (
    "You are Forge, a software maintenance agent. You solve one task at a time: read before "
    "you edit, run the tests after every change, keep changes minimal, and explain each step."
)
TASKS = ("the parser drops the last line of a file", "the cache never expires entries",
         "the CLI ignores its --quiet flag", "dates print in the wrong time zone",
         "a config file with a BOM fails to load", "retries sleep twice as long as asked",
         "the progress bar overflows at 100%", "unicode file names crash the uploader")  # fmt: skip
CONFIGS: dict[str, tuple[bool, int]] = {"interleaved": (False, 0), "batched": (True, 0)}


def prompt(agent: int) -> SegmentedPrompt:
    """Agent `agent`'s prompt: the system prompt, then a task whose length grows with it."""
    task = TASKS[agent % len(TASKS)]
    detail = " It happens on every run since the last release." * (1 + agent % 5)
    user = f"Task {agent}: {task}.{detail} Describe how you would find the cause."
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system"),
                            Segment(SegmentKind.UPDATE, user, "task", "user")])  # fmt: skip


def run(engine: Engine, agents: int, params: GenerationParams) -> dict[str, Any]:
    """All `agents` at once; wall time, tokens and each agent's TTFT and ids."""
    prompts = [prompt(i) for i in range(agents)]
    got, cpu = with_cpu_time(lambda: generate_at_once(engine, prompts, params, "full"))
    ids = [list(g.token_ids) for g in got.generations]
    # each one's decode alone, prefill excluded
    decode_tps = [g.stats.decode_tokens_per_s for g in got.generations]
    wall, tokens = got.wall_s, sum(len(x) for x in ids)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "cpu_s": cpu,
            "tokens_per_cpu_s": tokens / cpu, "ttft_s": got.ttft_s,
            "decode_tokens_per_s": decode_tps, "ids": ids}  # fmt: skip


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def compare(runs: list[dict[str, Any]], agents: list[int]) -> dict[str, Any]:
    """Every agent's greedy ids in every run against its run alone (N = 1 serves agent 0 only:
    the first run of each agent count, same configuration, is the reference for the rest) and
    against the interleaved engine's ids in the same repeat (each of its turns steps alone)."""
    # (config, agent) -> ids from the smallest N that ran the agent, first repeat; that N
    alone: dict[tuple[str, int], tuple[list[int], int]] = {}
    for r in sorted(runs, key=lambda r: (r["agents"], r["repeat"])):
        for i, ids in enumerate(r["ids"]):
            alone.setdefault((r["config"], i), (ids, r["agents"]))
    out = []
    for r in runs:
        ref = next(x for x in runs if x["repeat"] == r["repeat"] and x["agents"] == r["agents"]
                   and x["config"] == "interleaved")  # fmt: skip
        out.append({"repeat": r["repeat"], "agents": r["agents"], "config": r["config"],
                    "equal_alone": [ids == alone[(r["config"], i)][0]
                                    for i, ids in enumerate(r["ids"])],
                    "alone_from_agents": [alone[(r["config"], i)][1]
                                          for i in range(len(r["ids"]))],
                    "equal_interleaved": [a == b for a, b in zip(r["ids"], ref["ids"],
                                                                 strict=True)],
                    "tokens": [len(x) for x in r["ids"]]})  # fmt: skip
    return {
        "runs": out,
        "all_equal_alone": all(all(x["equal_alone"]) for x in out),
        "all_equal_interleaved": all(all(x["equal_interleaved"]) for x in out),
    }


def summarize(runs: list[dict[str, Any]], agents: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in agents:
        by = {c: [r for r in runs if r["agents"] == n and r["config"] == c] for c in CONFIGS}
        row: dict[str, Any] = {}
        for c, rs in by.items():
            tps = [r["tokens_per_s"] for r in rs]
            ttft = [t for r in rs for t in r["ttft_s"]]
            row[c] = {"tokens_per_s_median": statistics.median(tps), "tokens_per_s": tps,
                      "ttft_p50_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 0.99),
                      "ttft_n": len(ttft)}  # fmt: skip
        # within each repeat: batched over interleaved at the same N, agent 0's decode alone
        row["decode_batched_over_interleaved_agent0"] = [
            b["decode_tokens_per_s"][0] / i["decode_tokens_per_s"][0]
            for b, i in zip(by["batched"], by["interleaved"], strict=True)
        ]
        row["cpu_batched_over_interleaved"] = [  # tokens per CPU second, prefills included
            b["tokens_per_cpu_s"] / i["tokens_per_cpu_s"]
            for b, i in zip(by["batched"], by["interleaved"], strict=True)
        ]
        row["batched_over_interleaved"] = [
            b["tokens_per_s"] / i["tokens_per_s"]
            for b, i in zip(by["batched"], by["interleaved"], strict=True)
        ]
        out[str(n)] = row
    for c in CONFIGS:  # within each repeat: N agents over one alone, same configuration
        for n in agents:
            ones = [r for r in runs if r["agents"] == agents[0] and r["config"] == c]
            ns = [r for r in runs if r["agents"] == n and r["config"] == c]
            out[str(n)][c]["over_one_alone"] = [
                x["tokens_per_s"] / o["tokens_per_s"] for x, o in zip(ns, ones, strict=True)
            ]
        # N batched agents over one agent alone on today's interleaved engine
    for n in agents:
        bs = [r for r in runs if r["agents"] == n and r["config"] == "batched"]
        ones = [r for r in runs if r["agents"] == agents[0] and r["config"] == "interleaved"]
        out[str(n)]["batched_over_one_interleaved"] = [
            x["tokens_per_s"] / o["tokens_per_s"] for x, o in zip(bs, ones, strict=True)
        ]
    return out


def burst_rows(runs: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration other than interleaved and N: from `summarize`'s row, tokens/s
    (median over repeats), over one agent alone on the same configuration and TTFT p50/p99;
    and its tokens/s over `batched` in the same repeat."""
    out = []
    for c in CONFIGS:
        if c == "interleaved":
            continue
        for n, row in summary.items():
            rs = [r for r in runs if r["agents"] == int(n) and r["config"] == c]
            base = [r for r in runs if r["agents"] == int(n) and r["config"] == "batched"]
            out.append({
                "config": c, "agents": int(n),
                "tokens_per_s_median": row[c]["tokens_per_s_median"],
                "over_batched": [x["tokens_per_s"] / b["tokens_per_s"]
                                 for x, b in zip(rs, base, strict=True)],
                "over_one_alone": row[c]["over_one_alone"],
                "ttft_p50_s": row[c]["ttft_p50_s"], "ttft_p99_s": row[c]["ttft_p99_s"],
            })  # fmt: skip
    return out


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def report(results: dict[str, Any]) -> str:
    """results.json's summary as a table: per N, tokens/s of each configuration (median over
    repeats) and batched over interleaved within each repeat."""
    p, summary = results["provenance"], results["summary"]
    lines = [
        "# Batched decode against interleaved, concurrent agents on one engine",
        "",
        provenance_line(p),
        f"Model {results['settings']['model']}, greedy, {results['settings']['new_tokens']} "
        "new tokens per agent; ratios are within one repeat.",
        "",
        "| agents | interleaved tok/s (median) | batched tok/s (median) "
        "| batched / interleaved per repeat | median | agent 0's decode tok/s, batched / "
        "interleaved, median (range) | tokens per CPU second, batched / interleaved, median "
        "(range) | batched / one agent alone (batched), median (range) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, row in summary.items():
        ratios = row["batched_over_interleaved"]
        dec = row["decode_batched_over_interleaved_agent0"]
        cpu = row["cpu_batched_over_interleaved"]
        alone = row["batched"]["over_one_alone"]  # N agents over the first N's, each repeat
        lines.append(
            f"| {n} | {row['interleaved']['tokens_per_s_median']:.2f} "
            f"| {row['batched']['tokens_per_s_median']:.2f} "
            f"| {', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f} "
            f"| {statistics.median(dec):.2f} ({min(dec):.2f}-{max(dec):.2f}) "
            f"| {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) "
            f"| {statistics.median(alone):.2f} ({min(alone):.2f}-{max(alone):.2f}) |"
        )
    if any(r["config"] != "batched" for r in results.get("bursts", [])):
        lines += [
            "",
            "Batched configurations, prefill bursts included (`batched@B`: "
            "`prefill_burst_tokens=B`); ratios within each repeat, median (range):",
            "",
            "| configuration | agents | tok/s (median) | over `batched` | over one agent alone, "
            "same configuration | TTFT p50 | TTFT p99 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in results["bursts"]:
            lines.append(
                f"| {row['config']} | {row['agents']} | {row['tokens_per_s_median']:.2f} "
                f"| {spread(row['over_batched'])} | {spread(row['over_one_alone'])} "
                f"| {row['ttft_p50_s']:.2f} s | {row['ttft_p99_s']:.2f} s |"
            )
    a = results["agreement"]
    lines += [
        "",
        f"Every agent's greedy ids equal to its run alone: {a['all_equal_alone']}; "
        f"equal to the interleaved engine's in the same repeat: {a['all_equal_interleaved']}.",
        f"Scheduler counts (batched engine, all runs): {results['scheduler']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--kv-pages", type=int, default=512)
    ap.add_argument("--bursts", type=int, nargs="*", default=[],
                    help="also run the batched engine with these prefill_burst_tokens")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # of the code that runs, before the tree can change under a long run
    origin = provenance(script="benchmarks/server/batch_decode.py")
    model = load_model(None)
    params = GenerationParams(max_new_tokens=args.new_tokens)
    for b in args.bursts:
        if b > 0:
            CONFIGS[f"batched@{b}"] = (True, b)
    engines = {
        c: Engine(model, EngineConfig(strategy="full", kv_pages=args.kv_pages, batch_decode=b,
                                      prefill_burst_tokens=burst))
        for c, (b, burst) in CONFIGS.items()
    }  # fmt: skip
    runs = []
    for rep in range(args.repeats):
        for n in args.agents:
            order = list(engines.items())
            for c, e in order if rep % 2 == 0 else order[::-1]:  # which runs first alternates
                r = run(e, n, params)
                r |= {"repeat": rep, "agents": n, "config": c, "load_avg": os.getloadavg()[0]}
                runs.append(r)
                print(
                    f"rep {rep} N={n:2d} {c:11s} {r['tokens_per_s']:7.2f} tok/s  "
                    f"ttft p50 {statistics.median(r['ttft_s']):.3f}s  "
                    f"load {r['load_avg']:.2f}",
                    flush=True,
                )
    agreement = compare(runs, args.agents)
    batch = engines["batched"].batch
    for r in runs:
        r["ids"] = [list(x) for x in r["ids"]]
    summary = summarize(runs, args.agents)
    results = {
        "provenance": origin,
        "settings": vars(args) | {"out": str(args.out), "model": model.model_id,
                                  "strategy": "full", "greedy": True},
        "agreement": agreement,
        "runs": runs,
        "summary": summary,
        "bursts": burst_rows(runs, summary),
        "scheduler": None if batch is None else vars(batch.stats()),
    }  # fmt: skip
    write_run(args.out, results, report)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
