"""Exact turns at prefix speed, paired: the same hit request prefilled again and again by the
default (`rpdc`) and by `prefix`, alternating, each on its own engine and store filled by the
same setup requests (benchmarks/reuse/long_prompts.py's cases). One pair per repetition, the order
alternating, so drift on a shared machine hits both alike; the statistic is the median over
repetitions of the per-pair TTFT ratio, with its range.

    fresh    the setup request is the first: every segment's first copy is computed in the
             context the hits repeat (the default's runs are exact)
    stamped  a request with another time stamp comes first: the tools block's first copy is
             computed after it, and the setup reuses it approximately (no exact KV for the
             default in the hits' context: it probes)

    miss     no setup: the no-reuse request (a new time stamp first) prefilled by `full` and by
             every strategy of `--miss-strategies`, the order rotated per repetition; each
             strategy's TTFT over `full`'s in the same repetition (and the default's over
             `prefix`'s, which finds the stamp's first block)

The prefills are not committed (the stores stay as the setup left them, empty for `miss`).

    PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/reuse/exact_turns.py --reps 7 --threads 1 \\
        --out docs/bench/long-prompts/exact-pairs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, when loaded by path

from long_prompts import Request, bfcl_tools, requests, run_request, write_results

from agentcache.bench.provenance import specs_of
from agentcache.chat.segmenter import ConversationTracker
from agentcache.model.loading import load_model
from agentcache.runtime.engine import Engine, EngineConfig

LABELS = ("prefix", "rpdc")
HITS = ("system+tools", "history", "system")  # `system`: the system prompt only
MISS_STRATEGIES = "full,prefix,promptcache,pic,epic,cacheblend,cacheslide,rpdc"


def scenario(
    reqs: list[Request], stamped: bool, cases: list[str]
) -> tuple[list[Request], list[Request]]:
    """(setup requests, hit requests): the first setup (and, stamped, the no-reuse request
    before it), then the first request of each hit case."""
    first = [r for r in reqs if r.case == "no-reuse"][:1] if stamped else []
    setup = [r for r in reqs if r.case == "setup"][:1]
    hits = [next(r for r in reqs if r.case == c) for c in cases]
    return first + setup, hits


def prefill_once(engine: Engine, tracker: ConversationTracker, r: Request) -> dict[str, Any]:
    chat = tracker.segment(r.messages, r.tools)
    tokens = engine.tokenize(chat.prompt)
    t0 = time.perf_counter()
    seq, pre = engine.prefill(tokens)
    ttft = time.perf_counter() - t0
    seq.free()
    s = pre.stats
    return {
        "ttft_ms": ttft * 1e3, "prompt_tokens": s.prompt_tokens, "model_calls": s.model_calls,
        "loaded_tokens": s.loaded_tokens, "recomputed_tokens": s.recomputed_tokens,
        "exact_plan": s.exact_plan, "copies_found": s.copies_found,
        "probe_skipped": s.probe_skipped, "lookup_ms": s.lookup_s * 1e3,
        "load_ms": s.load_s * 1e3, "assemble_ms": s.assemble_s * 1e3,
        "compute_ms": s.compute_s * 1e3, "overhead_ms": s.overhead_s * 1e3,
    }  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    hits = [r for r in rows if r["scenario"] != "miss"]
    return summarize_hits(hits) + summarize_misses([r for r in rows if r["scenario"] == "miss"])


def summarize_misses(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy: TTFT over `full`'s (and over `prefix`'s) in the same repetition, median
    [min-max] over the repetitions."""
    reps: dict[int, dict[str, float]] = {}
    for r in rows:
        reps.setdefault(r["rep"], {})[r["strategy"]] = r["ttft_ms"]
    out = []
    for label in dict.fromkeys(r["strategy"] for r in rows):
        vs_full = [p[label] / p["full"] for p in reps.values() if {label, "full"} <= p.keys()]
        vs_prefix = [p[label] / p["prefix"] for p in reps.values() if {label, "prefix"} <= p.keys()]
        out.append({
            "scenario": "miss", "case": "no-reuse", "strategy": label, "n": len(vs_full),
            "ms_median": statistics.median(p[label] for p in reps.values() if label in p),
            **_spread("vs_full", vs_full), **_spread("vs_prefix", vs_prefix),
        })  # fmt: skip
    return out


def _spread(name: str, xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {f"{name}_median": None, f"{name}_min": None, f"{name}_max": None}
    return {f"{name}_median": statistics.median(xs), f"{name}_min": min(xs),
            f"{name}_max": max(xs)}  # fmt: skip


def summarize_hits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for scen in sorted({r["scenario"] for r in rows}):
        for case in dict.fromkeys(r["case"] for r in rows if r["scenario"] == scen):
            pairs: dict[int, dict[str, float]] = {}
            for r in rows:
                if (r["scenario"], r["case"]) == (scen, case):
                    pairs.setdefault(r["rep"], {})[r["strategy"]] = r["ttft_ms"]
            ratios = [p["rpdc"] / p["prefix"] for p in pairs.values() if len(p) == 2]
            out.append({
                "scenario": scen, "case": case, "n": len(ratios),
                "rpdc_vs_prefix_median": statistics.median(ratios),
                "rpdc_vs_prefix_min": min(ratios), "rpdc_vs_prefix_max": max(ratios),
                "prefix_ms_median": statistics.median(p["prefix"] for p in pairs.values()),
                "rpdc_ms_median": statistics.median(p["rpdc"] for p in pairs.values()),
            })  # fmt: skip
    return out


def report(results: dict[str, Any]) -> str:
    lines = [
        "# Exact turns at prefix speed: the default against `prefix`, paired per repetition",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit {results['commit']}, {results['date']}, {results['machine']}, load average "
        f"{results['load_average']} (1, 5, 15 min) when written.",
        "",
        "TTFT of `rpdc` / `prefix`'s in the same repetition (the order alternating): median "
        "[min-max] over n repetitions.",
        "",
        "| scenario | case | n | rpdc / prefix | prefix ms (median) | rpdc ms (median) |",
        "|---|---|---|---|---|---|",
    ]
    for s in results["summary"]:
        if s["scenario"] == "miss":
            continue
        lines.append(
            f"| {s['scenario']} | {s['case']} | {s['n']} | {s['rpdc_vs_prefix_median']:.3f} "
            f"[{s['rpdc_vs_prefix_min']:.3f}-{s['rpdc_vs_prefix_max']:.3f}] "
            f"| {s['prefix_ms_median']:.0f} | {s['rpdc_ms_median']:.0f} |"
        )
    lines += miss_table(results["summary"])
    lines += [
        "",
        "The work of each prefill (counted; the same in every repetition) and where its time "
        "went (ms, first repetition):",
        "",
        "| scenario | case | strategy | model calls | loaded | computed | exact plan | copies "
        "found | lookup | load | assemble | compute | overhead |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        if r["rep"] != 0:
            continue
        lines.append(
            f"| {r['scenario']} | {r['case']} | {r['strategy']} | {r['model_calls']} "
            f"| {r['loaded_tokens']} | {r['recomputed_tokens']} | {r['exact_plan']} "
            f"| {r['copies_found']} | {r['lookup_ms']:.1f} | {r['load_ms']:.1f} "
            f"| {r['assemble_ms']:.1f} | {r['compute_ms']:.0f} | {r['overhead_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def miss_table(summary: list[dict[str, Any]]) -> list[str]:
    misses = [s for s in summary if s["scenario"] == "miss"]
    if not misses:
        return []
    lines = [
        "",
        "Misses (`miss`: the no-reuse request, nothing stored): TTFT / `full`'s and / `prefix`'s "
        "in the same repetition (the order rotated), median [min-max] over n repetitions.",
        "",
        "| strategy | n | / full | / prefix | ms (median) |",
        "|---|---|---|---|---|",
    ]
    for s in misses:
        lines.append(
            f"| {s['strategy']} | {s['n']} | {_fmt(s, 'vs_full')} | {_fmt(s, 'vs_prefix')} "
            f"| {s['ms_median']:.0f} |"
        )
    return lines


def _fmt(s: dict[str, Any], name: str) -> str:
    if s[f"{name}_median"] is None:
        return "-"
    return f"{s[f'{name}_median']:.3f} [{s[f'{name}_min']:.3f}-{s[f'{name}_max']:.3f}]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--scenarios", default="fresh,stamped", help="of fresh,stamped,miss")
    p.add_argument("--hits", default="system+tools,history", help="of " + ",".join(HITS))
    p.add_argument("--miss-strategies", default=MISS_STRATEGIES, help="`miss`: full first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if unknown := set(a.hits.split(",")) - set(HITS):
        p.error(f"unknown hit cases {sorted(unknown)}; known: {', '.join(HITS)}")
    torch.set_num_threads(a.threads)
    model = load_model()
    reqs = list(requests(a.size, 1, model, bfcl_tools()))
    rows: list[dict[str, Any]] = []
    a.out.mkdir(parents=True, exist_ok=True)
    for scen in a.scenarios.split(","):
        if scen == "miss":
            rows += run_misses(model, reqs, a.miss_strategies.split(","), a.reps)
            write(a, rows)
            continue
        setup, hits = scenario(reqs, scen == "stamped", a.hits.split(","))
        engines = {
            label: (Engine(model, EngineConfig(strategy=label, kv_pages=1024)),
                    ConversationTracker())
            for label in LABELS
        }  # fmt: skip
        for r in setup:
            for engine, tracker in engines.values():
                run_request("engine", engine, tracker, r)
        for r in hits:
            for rep in range(a.reps):
                order = LABELS if rep % 2 == 0 else LABELS[::-1]
                for label in order:
                    engine, tracker = engines[label]
                    x = prefill_once(engine, tracker, r)
                    rows.append({"scenario": scen, "case": r.case, "rep": rep,
                                 "strategy": label, **x})  # fmt: skip
                    print(f"{scen} {r.case} #{rep} {label}: {x['ttft_ms']:.0f} ms, calls "
                          f"{x['model_calls']}, computed {x['recomputed_tokens']}",
                          file=sys.stderr, flush=True)  # fmt: skip
            engine_stats = [run_request("engine", e, t, r) for e, t in engines.values()]
            del engine_stats  # each store takes the hit request, as a served one would
        write(a, rows)


def run_misses(
    model: Any, reqs: list[Request], labels: list[str], reps: int
) -> list[dict[str, Any]]:
    """The no-reuse request prefilled by every strategy, one engine each, `reps` times, the
    order rotated per repetition; nothing is committed, so every prefill is a miss."""
    miss = next(r for r in reqs if r.case == "no-reuse")
    engines = {label: (Engine(model, EngineConfig(strategy=label, kv_pages=1024)),
                       ConversationTracker()) for label in labels}  # fmt: skip
    rows = []
    for rep in range(reps):
        k = rep % len(labels)
        for label in labels[k:] + labels[:k]:
            x = prefill_once(*engines[label], miss)
            rows.append({"scenario": "miss", "case": miss.case, "rep": rep, "strategy": label, **x})
            print(f"miss #{rep} {label}: {x['ttft_ms']:.0f} ms, calls {x['model_calls']}, "
                  f"computed {x['recomputed_tokens']}", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def write(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    specs = specs_of(dict.fromkeys([*LABELS, *(r["strategy"] for r in rows)]))
    write_results(a.out, "benchmarks/reuse/exact_turns.py", specs, rows, summarize(rows), report)


if __name__ == "__main__":
    main()
