"""Where a prefill's time goes, per stage, for each strategy on the same requests: lookup,
load (re-rotation included), assembly (writing fresh K/V, gathering each layer's context),
compute (model calls), the rest (selection, ranking, guard), and the commit after it.

    request -> [lookup][load][ compute (model calls) + assembly, per layer ][rest] = TTFT
                                                                        then [commit]

Requests are benchmarks/reuse/long_prompts.py's (tools blocks as the server renders them, through
the server's segmenter, engine path), one engine per strategy, the order rotated per request. With
`--ops`, each prefill also runs under `torch.profiler` and its model time is split by operator
kind (attention kernels, matrix products, copies, the rest): the profiler's own overhead makes
those shares, not the stage times, the figure to read from that table.

    PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1 nice -n -5 .venv/bin/python \\
        benchmarks/reuse/prefill_profile.py --size 2000 --cases no-reuse,system+tools,history \\
        --strategies full,prefix,rpdc --requests 2 --threads 2 --out docs/bench/long-prompts/profile
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

from long_prompts import CASES, Request, bfcl_tools, requests

from agentcache.bench.provenance import load_average, provenance, specs_of
from agentcache.bench.results import write_run
from agentcache.chat.segmenter import ConversationTracker
from agentcache.model.loading import load_model
from agentcache.runtime.engine import Engine, EngineConfig

STAGES = ("lookup", "load", "assemble", "compute", "rest", "commit")
OP_KINDS = {
    "attention": ("flash_attention", "scaled_dot_product", "_efficient_attention"),
    "matmul": ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm"),
    "copy": ("aten::copy_", "aten::index_copy", "aten::index", "aten::cat", "aten::clone"),
}


def profile_request(engine: Engine, tracker: ConversationTracker, r: Request, ops: bool) -> dict:
    """One request's prefill and commit, timed per stage (seconds), with its work counts."""
    chat = tracker.segment(r.messages, r.tools)
    prompt = engine.tokenize(chat.prompt)
    prof = torch.profiler.profile() if ops else None
    t0 = time.perf_counter()
    if prof is not None:
        with prof:
            seq, pre = engine.prefill(prompt)
    else:
        seq, pre = engine.prefill(prompt)
    ttft = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine.commit(prompt, seq, pre)
    commit = time.perf_counter() - t1
    seq.free()
    tracker.record(chat, None)
    s = pre.stats
    rest = s.overhead_s - s.lookup_s - s.load_s - s.assemble_s
    stages = {"lookup": s.lookup_s, "load": s.load_s, "assemble": s.assemble_s,
              "compute": s.compute_s, "rest": max(0.0, rest), "commit": commit}  # fmt: skip
    out: dict[str, Any] = {
        "prompt_tokens": s.prompt_tokens, "ttft_s": ttft, "stages_s": stages,
        "loaded_tokens": s.loaded_tokens, "computed_tokens": s.recomputed_tokens,
        "model_calls": s.model_calls, "exact_plan": s.exact_plan, "guarded": s.guarded,
    }  # fmt: skip
    if prof is not None:
        out["ops_s"] = op_kinds(prof)
    return out


def op_kinds(prof: torch.profiler.profile) -> dict[str, float]:
    """Self CPU time (s) per operator kind."""
    kinds = dict.fromkeys([*OP_KINDS, "other"], 0.0)
    for e in prof.key_averages():
        kind = next((k for k, names in OP_KINDS.items() if any(n in e.key for n in names)), None)
        if e.key.startswith("aten::") or kind is not None:
            kinds[kind or "other"] += e.self_cpu_time_total / 1e6
    return kinds


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (case, strategy): median TTFT and stage times, and TTFT / full's on the same request."""
    full = {(r["case"], r["request"]): r for r in rows if r["strategy"] == "full"}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["case"] != "setup":
            groups.setdefault((r["case"], r["strategy"]), []).append(r)
    out = []
    for (case, label), rs in groups.items():
        ratios = [
            r["ttft_s"] / full[(case, r["request"])]["ttft_s"]
            for r in rs
            if (case, r["request"]) in full
        ]
        out.append({
            "case": case, "strategy": label, "n": len(rs),
            "ttft_ms": statistics.median(r["ttft_s"] for r in rs) * 1e3,
            "vs_full": statistics.median(ratios) if ratios else None,
            "vs_full_range": [min(ratios), max(ratios)] if ratios else None,
            "stages_ms": {k: statistics.median(r["stages_s"][k] for r in rs) * 1e3 for k in STAGES},
            "computed_tokens": statistics.median(r["computed_tokens"] for r in rs),
        })  # fmt: skip
    return out


def report(results: dict[str, Any]) -> str:
    p = results["provenance"]
    lines = [
        "# Where a prefill's time goes, per stage",
        "",
        f"Command: `{p['command']}`  ",
        f"Commit {p['commit']}, {p['date']}, {p['machine']}, load average before / after "
        f"{results['load_before']} / {results['load_after']}.",
        "",
        "Medians over n requests (ms); TTFT / full's on the same request: median [min-max]. "
        "Compute is the model calls' time; assembly is writing fresh K/V and gathering each "
        "layer's context; the commit runs after the first token and is not in TTFT.",
        "",
        "| case | strategy | n | computed | TTFT | / full | " + " | ".join(STAGES) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(STAGES),
    ]
    for s in results["summary"]:
        vs = (
            "-"
            if s["vs_full"] is None
            else (f"{s['vs_full']:.3f} [{s['vs_full_range'][0]:.3f}-{s['vs_full_range'][1]:.3f}]")
        )
        stages = " | ".join(f"{s['stages_ms'][k]:.1f}" for k in STAGES)
        lines.append(
            f"| {s['case']} | {s['strategy']} | {s['n']} | {s['computed_tokens']:.0f} "
            f"| {s['ttft_ms']:.0f} | {vs} | {stages} |"
        )
    with_ops = [r for r in results["rows"] if "ops_s" in r]
    if with_ops:
        kinds = list(with_ops[0]["ops_s"])
        lines += ["", "Operator time under `torch.profiler` (s, self CPU), per request:", "",
                  "| case | # | strategy | " + " | ".join(kinds) + " |",
                  "|---|---|---|" + "---|" * len(kinds)]  # fmt: skip
        for r in with_ops:
            cells = " | ".join(f"{r['ops_s'][k]:.2f}" for k in kinds)
            lines.append(f"| {r['case']} | {r['request']} | {r['strategy']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=2000, help="prompt tokens (about)")
    p.add_argument("--cases", default="no-reuse,system+tools,history", help=",".join(CASES))
    p.add_argument("--strategies", default="full,prefix,rpdc")
    p.add_argument("--requests", type=int, default=2, help="measured requests per case")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ops", action="store_true", help="operator kinds under torch.profiler")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    cases = a.cases.split(",")
    if unknown := set(cases) - set(CASES):
        p.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    torch.set_num_threads(a.threads)
    labels = a.strategies.split(",")
    model = load_model()
    engines = {x: (Engine(model, EngineConfig(strategy=x, kv_pages=1024)), ConversationTracker())
               for x in labels}  # fmt: skip
    load_before = load_average()
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(requests(a.size, a.requests, model, bfcl_tools())):
        if not r.wanted(cases):
            continue
        k = i % len(labels)
        for label in labels[k:] + labels[:k]:
            engine, tracker = engines[label]
            with torch.inference_mode():
                x = profile_request(engine, tracker, r, a.ops)
            rows.append({"case": r.case, "request": r.index, "strategy": label, **x})
            print(f"{r.case}#{r.index} {label}: {x['ttft_s'] * 1e3:.0f} ms "
                  + " ".join(f"{k}={v * 1e3:.1f}" for k, v in x["stages_s"].items()),
                  file=sys.stderr, flush=True)  # fmt: skip
            write(a.out, labels, rows, load_before, argv)  # a run cut short keeps its rows


def write(
    out: Path, labels: list[str], rows: list[dict[str, Any]], load_before: list[float],
    argv: list[str] | None,
) -> None:  # fmt: skip
    prov = provenance(specs_of(labels), argv=argv, script="benchmarks/reuse/prefill_profile.py")
    results = {
        "provenance": prov, "load_before": load_before, "load_after": load_average(),
        "summary": summarize(rows), "rows": rows,
    }  # fmt: skip
    write_run(out, results, report)


if __name__ == "__main__":
    main()
