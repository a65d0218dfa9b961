"""Exact turns at prefix speed, paired: a hit request prefilled again and again by the default
(`rpdc`) and by `prefix`, alternating, each on its own engine and store filled by the same setup
requests (benchmarks/reuse/long_prompts.py's cases). One pair per repetition, the order
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

Two paths (`--path`):

    engine   `Engine.prefill` on the server's segmentation, never committed: every repetition
             is the same request on the store the setup left (empty for `miss`); TTFT timed
             around the prefill
    server   `ChatEngine.complete` in-process, as the server runs a request: every request is
             committed (its segments and its one-token reply stored), so the same request
             twice would be a full hit. Each repetition is instead an equivalent request,
             not an identical one, and one of the same form runs first, unmeasured, so every
             measured repetition meets the same store state:

               system+tools  a fresh final user message
               history       a fresh tool round (call, result) and user message after the
                             setup's first message (`prefix` also finds the call's opening,
                             shared with the earlier rounds, as repeated calls of a tool are)
               system        a fresh user message and another tools block (another tool
                             subset, `tools_of` from another first tool)
               miss          a new time stamp, another tools block and a fresh user message:
                             nothing is reusable but the blocks `prefix` finds before the
                             stamp's minute

             Every strategy in a repetition gets the same request text (one engine and
             tracker each). A request's varying part starts with one digit (the user message's
             first character, the tool call's item, the stamp's last minute digit) and the
             tools blocks' first tool names start with distinct letters, so its shared opening
             with every earlier request is as long in every repetition (at most 9). TTFT is the
             server's (`TurnStats.ttft_s`, what `X-Agentcache-TTFT-Ms` carries). `system`
             and `miss` requests differ in their tools block, so in their size.

Every row records the counted work (model calls, reused, loaded and computed tokens).

    PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/reuse/exact_turns.py --reps 7 --threads 1 \\
        --out docs/bench/long-prompts/exact-pairs
    ... exact_turns.py --path server --scenarios miss,fresh --reps 5 --threads 1 \\
        --out docs/bench/long-prompts/server-paired-4k
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings, when loaded by path

from long_prompts import (
    QUESTIONS,
    Request,
    bfcl_tools,
    requests,
    run_request,
    system,
    tools_of,
    write_results,
)

from agentcache.bench.provenance import specs_of
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.segmenter import ConversationTracker
from agentcache.model.loading import LoadedModel, load_model
from agentcache.runtime.engine import Engine, EngineConfig

LABELS = ("prefix", "rpdc")
HITS = ("system+tools", "history", "system")  # `system`: the system prompt only
MISS_STRATEGIES = "full,prefix,promptcache,pic,epic,cacheblend,cacheslide,rpdc"
PATHS = ("engine", "server")
Served = tuple[Engine, ConversationTracker]
VARIANTS = 10  # server path: one digit varies per request, the unmeasured first one included


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


def serve_once(engine: Engine, tracker: ConversationTracker, r: Request) -> dict[str, Any]:
    """`r` as the server runs it (committed); TTFT the one the server reports."""
    s = run_request("server", engine, tracker, r)
    return {
        "ttft_ms": s.ttft_s * 1e3, "prompt_tokens": s.prompt_tokens,
        "model_calls": s.model_calls, "reused_tokens": s.reused_tokens,
        "loaded_tokens": s.loaded_tokens, "recomputed_tokens": s.recomputed_tokens,
        "exact_plan": s.exact_plan, "context_copy_tokens": s.context_copy_tokens,
        "guarded": s.guarded, "fallbacks": s.fallbacks,
    }  # fmt: skip


class Variants:
    """The server path's equivalent requests: variant `k` of a case's request (0: the
    unmeasured first one, 1..: the repetitions). What varies starts with the digit `k`."""

    def __init__(self, model: LoadedModel, tools: list[ToolSpec], size: int) -> None:
        block = tools_of(model, tools, 0, int(size * 0.9))
        firsts = distinct_firsts(tools, block[0].name[0])
        self.size = size
        self.blocks = [tools_of(model, tools, i, int(size * 0.9)) for i in firsts[:VARIANTS]]

    def hit(self, r: Request, k: int) -> Request:
        last = r.messages[-1]
        fresh = ChatMessage("user", f"{k}) {last.content}")
        if r.case == "history":  # the setup's first message, then a fresh round
            msgs = (*r.messages[:2], *tool_round(k), fresh)
            return Request(r.size, r.case, k, msgs, r.tools)
        tl = tuple(self.blocks[k]) if r.case == "system" else r.tools
        return Request(r.size, r.case, k, (*r.messages[:-1], fresh), tl)

    def miss(self, k: int) -> Request:
        stamp = 10 * self.size + k  # minutes: only the last digit varies
        msgs = (system(stamp), ChatMessage("user", f"{k}) {QUESTIONS[0]}"))
        return Request(self.size, "no-reuse", k, msgs, tuple(self.blocks[k]))


def distinct_firsts(tools: list[ToolSpec], taken: str) -> list[int]:
    """Indices of tools whose names start with a letter no earlier one (nor `taken`) does."""
    seen, out = {taken}, []
    for i, t in enumerate(tools):
        if t.name[0] not in seen:
            seen.add(t.name[0])
            out.append(i)
    if len(out) < VARIANTS:
        raise ValueError(f"{len(out)} tool names with distinct first letters; need {VARIANTS}")
    return out


def tool_round(k: int) -> list[ChatMessage]:
    """A tool call and its result (long_prompts.step's), as many tokens for every k < 10."""
    call = ToolCall(f"call_{k}", "get_state", {"item": k})
    result = json.dumps({"item": k, "status": "ok", "values": list(range(40 + k, 80 + k))})
    return [ChatMessage("assistant", "", (call,)), ChatMessage("tool", result, (), f"call_{k}")]


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
    path = next((r.get("path", "engine") for r in results["rows"]), "engine")
    lines = [
        "# Exact turns at prefix speed: the default against `prefix`, paired per repetition",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit {results['commit']}, {results['date']}, {results['machine']}, load average "
        f"{results['load_average']} (1, 5, 15 min) when written.",
        "",
        f"Path: `{path}` ({PATH_NOTES[path]}).",
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
    lines += miss_table(results["summary"], path)
    work = engine_work if path == "engine" else server_work
    return "\n".join(lines + work(results["rows"])) + "\n"


PATH_NOTES = {
    "engine": "`Engine.prefill`, not committed: every repetition the same request; TTFT timed "
    "around the prefill",
    "server": "`ChatEngine.complete` in-process, every request committed: each repetition an "
    "equivalent request (fresh user message; history a fresh tool round; system and miss another "
    "tools block; miss a new stamp) after one unmeasured; TTFT the server's `TurnStats.ttft_s`",
}


def engine_work(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "The work of each prefill (counted; the same in every repetition) and where its time "
        "went (ms, first repetition):",
        "",
        "| scenario | case | strategy | model calls | loaded | computed | exact plan | copies "
        "found | lookup | load | assemble | compute | overhead |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["rep"] != 0:
            continue
        lines.append(
            f"| {r['scenario']} | {r['case']} | {r['strategy']} | {r['model_calls']} "
            f"| {r['loaded_tokens']} | {r['recomputed_tokens']} | {r['exact_plan']} "
            f"| {r['copies_found']} | {r['lookup_ms']:.1f} | {r['load_ms']:.1f} "
            f"| {r['assemble_ms']:.1f} | {r['compute_ms']:.0f} | {r['overhead_ms']:.1f} |"
        )
    return lines


def server_work(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "The work of each request, every repetition (counted; `system` and `miss` requests "
        "differ in their tools block, so in their prompt tokens):",
        "",
        "| scenario | case | # | strategy | tokens | TTFT ms | model calls | reused | loaded "
        "| computed | exact plan | context copy | guarded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['case']} | {r['rep']} | {r['strategy']} "
            f"| {r['prompt_tokens']} | {r['ttft_ms']:.0f} | {r['model_calls']} "
            f"| {r['reused_tokens']} | {r['loaded_tokens']} | {r['recomputed_tokens']} "
            f"| {r['exact_plan']} | {r['context_copy_tokens']} | {r['guarded']} |"
        )
    return lines


def miss_table(summary: list[dict[str, Any]], path: str = "engine") -> list[str]:
    misses = [s for s in summary if s["scenario"] == "miss"]
    if not misses:
        return []
    stored = "nothing stored" if path == "engine" else "only earlier misses stored"
    lines = [
        "",
        f"Misses (`miss`: the no-reuse request, {stored}): TTFT / `full`'s and / `prefix`'s "
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
    p.add_argument("--path", default="engine", choices=PATHS)
    p.add_argument("--scenarios", default="fresh,stamped", help="of fresh,stamped,miss")
    p.add_argument("--hits", default="system+tools,history", help="of " + ",".join(HITS))
    p.add_argument("--miss-strategies", default=MISS_STRATEGIES, help="`miss`: full first")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if unknown := set(a.hits.split(",")) - set(HITS):
        p.error(f"unknown hit cases {sorted(unknown)}; known: {', '.join(HITS)}")
    if a.path == "server" and a.reps >= VARIANTS:
        p.error(f"--path server: at most {VARIANTS - 1} repetitions")
    torch.set_num_threads(a.threads)
    model = load_model()
    tools = bfcl_tools()
    reqs = list(requests(a.size, 1, model, tools))
    variants = Variants(model, tools, a.size) if a.path == "server" else None
    rows: list[dict[str, Any]] = []
    a.out.mkdir(parents=True, exist_ok=True)
    for scen in a.scenarios.split(","):
        if scen == "miss":
            rows += run_misses(model, reqs, a.miss_strategies.split(","), a.reps, variants)
        else:
            setup, hits = scenario(reqs, scen == "stamped", a.hits.split(","))
            rows += run_hits(model, scen, setup, hits, a.reps, variants)
        write(a, rows)


def engines_of(model: LoadedModel, labels: Iterable[str]) -> dict[str, Served]:
    return {label: (Engine(model, EngineConfig(strategy=label, kv_pages=1024)),
                    ConversationTracker()) for label in labels}  # fmt: skip


def run_hits(
    model: LoadedModel, scen: str, setup: list[Request], hits: list[Request], reps: int,
    variants: Variants | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each hit case `reps` times by `rpdc` and `prefix`, the order alternating, on stores the
    setup filled. Engine path (`variants` None): the same request, prefilled, committed once
    after; server path: variant 0 served unmeasured, then variants 1..reps."""
    path = "engine" if variants is None else "server"
    engines = engines_of(model, LABELS)
    for r in setup:
        for engine, tracker in engines.values():
            run_request(path, engine, tracker, r)
    rows = []
    for r in hits:
        if variants is not None:
            for served in engines.values():
                serve_once(*served, variants.hit(r, 0))
        for rep in range(reps):
            x = r if variants is None else variants.hit(r, rep + 1)
            for label in LABELS if rep % 2 == 0 else LABELS[::-1]:
                rows.append(measure(path, scen, rep, label, engines[label], x))
        if variants is None:  # each store takes the hit request, as a served one would
            for engine, tracker in engines.values():
                run_request("engine", engine, tracker, r)
    return rows


def measure(
    path: str, scen: str, rep: int, label: str, served: Served, r: Request
) -> dict[str, Any]:
    x = prefill_once(*served, r) if path == "engine" else serve_once(*served, r)
    print(f"{path} {scen} {r.case} #{rep} {label}: {x['ttft_ms']:.0f} ms, calls "
          f"{x['model_calls']}, loaded {x['loaded_tokens']}, computed {x['recomputed_tokens']}",
          file=sys.stderr, flush=True)  # fmt: skip
    return {"path": path, "scenario": scen, "case": r.case, "rep": rep, "strategy": label, **x}


def run_misses(
    model: LoadedModel, reqs: list[Request], labels: list[str], reps: int,
    variants: Variants | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The no-reuse request by every strategy, one engine each, `reps` times, the order
    rotated per repetition. Engine path (`variants` None): never committed, so every prefill
    is a miss; server path: variant 0 served unmeasured, then variants 1..reps."""
    path = "engine" if variants is None else "server"
    miss = next(r for r in reqs if r.case == "no-reuse")
    engines = engines_of(model, labels)
    if variants is not None:
        for served in engines.values():
            serve_once(*served, variants.miss(0))
    rows = []
    for rep in range(reps):
        x = miss if variants is None else variants.miss(rep + 1)
        k = rep % len(labels)
        for label in labels[k:] + labels[:k]:
            rows.append(measure(path, "miss", rep, label, engines[label], x))
    return rows


def write(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    specs = specs_of(dict.fromkeys([*LABELS, *(r["strategy"] for r in rows)]))
    write_results(a.out, "benchmarks/reuse/exact_turns.py", specs, rows, summarize(rows), report)


if __name__ == "__main__":
    main()
