#!/usr/bin/env python3
"""Concurrent agents at a fixed KV budget: sparse decode (fast tier only in the pool) against
dense, aggregate tokens/s on one embedded engine.

    nice -n -5 python benchmarks/server/kv_budget.py --agents 12 --context 4096 \
        --budget-turns 4 --policies dense,flexicache,flexicache:verify=8 --repeats 3 \
        --profile docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json \
        --out docs/bench/server/kv-budget/smollm2-ctx4096

N agents read the same document (the swe_agent workload's texts unless --workload names
another, cut so that the document, an agent's question and its new tokens make --context
tokens) and each asks its own question,
all at once, greedy. One engine per decode policy, each with the same KV pool
(`EngineConfig.kv_bytes` = --budget-turns turns' pages: prompt, new tokens and the reply's
closing tokens), batched decode on. A dense turn holds its pages to its end; a sparse turn
gives back all but as many as its fast tier fills once its decoder holds the KV
(`decode.setup.fast_tier_pages`; the host tier's copy is not counted), so more sparse turns
run at once (`PageGate.peak_running`). Before each run one request commits the document's KV,
and every agent's turn runs `prefix` (the document loaded, its question computed), so the run
is mostly decode, as in the sessions of agents that share their context.

The agents share the document only so that loading it is cheap: each engine runs with
`share_pages` off, each turn holding its own pages, so the run stands for N agents with
contexts of their own. A policy named with `+shared` (`dense+shared`) runs on an engine with
it on (`EngineConfig.share_pages`, kv/shared.py): the turns hold the document's full pages
once, as N agents reading one document or system prompt would.

Per run: tokens over the wall time from the common start to the last reply, the most turns
running at once, TTFT per agent, and the scheduler's counts; each repeat runs every policy,
in an order rotated from repeat to repeat, so that a policy's tokens/s over dense's is within
one repeat. Each agent's greedy ids are compared with dense's in the same repeat (verified
decoding gives dense's output by construction; unverified sparse decoding need not). Writes
results.json (with provenance) and report.md under --out.
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
from agentcache.bench.server.at_once import generate_at_once
from agentcache.decode.config import DecodeConfig
from agentcache.heads.prompts import load_texts, text_of_tokens
from agentcache.kv.pool import PoolConfig
from agentcache.model.loading import LoadedModel, load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import REPLY_CLOSING, Engine, EngineConfig, GenerationParams

QUESTIONS = ("Which file should be changed first, and why?",
             "Summarize the failing test in one sentence.", "What is the root cause of the bug?",
             "List the commands run so far.", "Which function handles the parsing?",
             "What would a minimal patch look like?", "Is an earlier issue mentioned?",
             "What should the next step be?")  # fmt: skip
SHARED = "+shared"  # a policy on an engine whose turns share common pages
QUESTION_ROOM = 64  # tokens kept for the chat format and an agent's question
WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "swe_agent.jsonl"


def prompts(doc: str, agents: int) -> list[SegmentedPrompt]:
    """Agent i's prompt: the document (system), then question i (user)."""
    return [SegmentedPrompt([Segment(SegmentKind.SYSTEM, doc, "doc", "system"),
                             Segment(SegmentKind.UPDATE, f"Agent {i}: {QUESTIONS[i % 8]}", "q",
                                     "user")]) for i in range(agents)]  # fmt: skip


def budget_bytes(model: LoadedModel, prompt_tokens: int, new_tokens: int, turns: float) -> int:
    """KV bytes of `turns` dense turns' pages (prompt, new tokens, the reply's closing)."""
    c, page = model.config, EngineConfig().page_size
    pool = PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 1, page)
    pages = -(-(prompt_tokens + new_tokens + REPLY_CLOSING) // page)
    return int(turns * pages * pool.page_bytes)


def engine(model: LoadedModel, decode: DecodeConfig, kv_bytes: int, share: bool) -> Engine:
    return Engine(model, EngineConfig(strategy="prefix", kv_bytes=kv_bytes, batch_decode=True,
                                      decode=decode, share_pages=share))  # fmt: skip


def run(e: Engine, agents: list[SegmentedPrompt], params: GenerationParams) -> dict[str, Any]:
    """The document committed by one request, then every agent at once (`prefix`, nothing
    committed): wall time, tokens, TTFT and ids per agent, the most turns running at once."""
    e.generate(agents[0], GenerationParams(max_new_tokens=1), "prefix", commit=True)
    waited0 = e.gate.waited
    e.gate.peak_running = 0  # this run's
    e.ctx.pool.peak_pages_used = e.ctx.pool.num_used
    before = step_seconds(e)
    got = generate_at_once(e, agents, params, "prefix")
    after = step_seconds(e)
    ids = [list(g.token_ids) for g in got.generations]
    fast = [0 if g.stats.decode is None
            else g.stats.decode.fast_tier_kv_bytes + g.stats.decode.metadata_bytes
            for g in got.generations]  # fmt: skip
    tokens = sum(len(x) for x in ids)
    stats = [g.stats.decode for g in got.generations if g.stats.decode is not None]
    verify = {"decoded": sum(max(len(x) - 1, 0) for x in ids),  # after each first token
              "drafted": sum(d.drafted_tokens for d in stats),
              "accepted": sum(d.accepted_tokens for d in stats),
              "passes": sum(d.verify_passes for d in stats)}  # fmt: skip
    return {"wall_s": got.wall_s, "tokens": tokens, "tokens_per_s": tokens / got.wall_s,
            "verify": verify,
            "shared_pages": [g.stats.shared_pages for g in got.generations],
            "peak_pages_used": e.ctx.pool.peak_pages_used,
            "ttft_s": got.ttft_s, "ids": ids, "peak_running": e.gate.peak_running,
            "waited": e.gate.waited - waited0, "fast_tier_bytes": fast,
            "pool_bytes": e.pool_config.pool_bytes,
            # where the time went: each turn's prefill (under the engine's lock, waits left
            # out) and the steps' model work by part (`BatchStats.step_seconds`)
            "prefill_s": sum(g.stats.ttft_s for g in got.generations),
            "step_seconds": {k: after[k] - before.get(k, 0.0) for k in after}}  # fmt: skip


def step_seconds(e: Engine) -> dict[str, float]:
    return dict(e.batch.stats().step_seconds) if e.batch is not None else {}


# `BatchStats.step_seconds` keys and their names, in the order of the report's columns and
# the plot's bars (between the prefills and the rest of the wall)
PARTS = (("attention:dense", "dense rows' attention"),
         ("attention:sparse", "sparse rows' attention"),
         ("attention:verify", "verify passes' attention"), ("rest", "shared by the rows"),
         ("alone", "a turn alone"))  # fmt: skip
SPLIT = (("prefill", "prefills"), *PARTS, ("else", "rest of the wall"))


def time_split(rs: list[dict[str, Any]]) -> dict[str, float]:
    """Median over a policy's runs of each part's seconds: wall, prefills, the step parts,
    and the rest of the wall (waits, decoder set-up not hidden, scheduling)."""

    def part(r: dict[str, Any], key: str) -> float:
        return float(r["step_seconds"].get(key, 0.0))

    out = {"wall": statistics.median(r["wall_s"] for r in rs),
           "prefill": statistics.median(r["prefill_s"] for r in rs)}  # fmt: skip
    for key, _ in PARTS:
        out[key] = statistics.median(part(r, key) for r in rs)
    out["else"] = statistics.median(
        r["wall_s"] - r["prefill_s"] - sum(part(r, k) for k, _ in PARTS) - part(r, "chunks")
        for r in rs
    )
    return out


def summarize(runs: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """Per policy: tokens/s (median over repeats), over dense's within each repeat, the most
    turns running at once, and the agents whose greedy ids equal dense's in the same repeat."""
    out: dict[str, Any] = {}
    dense = {r["repeat"]: r for r in runs if r["policy"] == "dense"}
    for p in policies:
        rs = [r for r in runs if r["policy"] == p]
        row: dict[str, Any] = {
            "tokens_per_s": [r["tokens_per_s"] for r in rs],
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
            "peak_running": [r["peak_running"] for r in rs],
            "ttft_p50_s": statistics.median(t for r in rs for t in r["ttft_s"]),
            "fast_tier_bytes_per_turn": max(max(r["fast_tier_bytes"]) for r in rs),
            "shared_pages_per_turn": statistics.median(n for r in rs for n in r["shared_pages"]),
            "peak_pages_used": [r["peak_pages_used"] for r in rs],
            "time_s": time_split(rs),
            **{
                k: sum(r["verify"][k] for r in rs)
                for k in ("decoded", "drafted", "accepted", "passes")
            },
        }
        if dense:
            over = [r["tokens_per_s"] / dense[r["repeat"]]["tokens_per_s"] for r in rs]
            row["over_dense"] = over
            row["over_dense_median"] = statistics.median(over)
            same = [a == b for r in rs for a, b in zip(r["ids"], dense[r["repeat"]]["ids"],
                                                       strict=True)]  # fmt: skip
            row["equal_dense"] = sum(same)
            row["compared"] = len(same)
        first = rs[0]["ids"]
        row["same_every_repeat"] = all(r["ids"] == first for r in rs)
        out[p] = row
    return out


def plot_time(results: dict[str, Any], path: Path) -> None:
    """Stacked bars of where each policy's run went (`time_split`), one bar per policy; no
    file for results older than the split."""
    if not has_split(results):
        return
    rows = {n: r["time_s"] for n, r in results["summary"].items()}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(rows)))
    names = list(rows)
    left = [0.0] * len(names)
    for key, label in SPLIT:
        widths = [max(rows[n][key], 0.0) for n in names]
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds of a run (median over repeats)")
    s = results["settings"]
    ax.set_title(f"Where a run's time went: {s['agents']} agents, "
                 f"{results['prompt_tokens']}-token prompts, a pool of {s['budget_turns']:g} "
                 "dense turns", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def has_split(results: dict[str, Any]) -> bool:
    """Whether every policy's summary has `time_split`'s parts (runs since it was kept)."""
    return all("time_s" in row for row in results["summary"].values())


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def time_lines(results: dict[str, Any]) -> list[str]:
    """The report's table of where each policy's run went (`time_split`), and its plot."""
    lines = ["", "Where a run's time went, seconds (median over repeats): the wall time from the "
              "common start to the last reply; the turns' prefills, summed (each under the "
              "engine's lock, its wait left out); the steps' model work by part "
              "(`BatchStats.step_seconds`: the attention of dense rows, of sparse rows and of "
              "verify passes, each with its rows' per-layer work; the work the rows of a step "
              "share, its matrix products, norms and logits; steps of a turn alone); and the "
              "rest of the wall (waits, decoder set-up not hidden behind a step, "
              "scheduling).", "",
              "| policy | wall | " + " | ".join(n for _, n in SPLIT) + " |",
              "|---|---|" + "---|" * len(SPLIT)]  # fmt: skip
    for name, row in results["summary"].items():
        t = row["time_s"]
        cells = " | ".join(f"{t[k]:.2f}" for k, _ in SPLIT)
        lines.append(f"| `{name}` | {t['wall']:.2f} | {cells} |")
    return [*lines, "", "![where a run's time went](time_split.png)"]


def report(results: dict[str, Any]) -> str:
    p, s = results["provenance"], results["settings"]
    lines = [
        "# Concurrent agents at a fixed KV budget: sparse decode against dense",
        "",
        provenance_line(p),
        f"Model {s['model']}, {s['agents']} agents, prompts of {results['prompt_tokens']} tokens "
        f"(a shared document loaded by `prefix`, then the agent's question), "
        f"{s['new_tokens']} greedy new tokens each, KV pool {results['pool_bytes']} bytes "
        f"({s['budget_turns']} dense turns, {results.get('pool_pages', '?')} pages), "
        f"{s['repeats']} repeats; ratios within each repeat.",
        "",
        "| policy | tok/s (median) | over dense per repeat, median (range) | turns at once "
        "| fast tier per turn (bytes) | TTFT p50 | agents = dense | same each repeat "
        "| pages shared per turn (median) | most pages in use |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results["summary"].items():
        over = spread(row["over_dense"]) if "over_dense" in row else "-"
        same = f"{row['equal_dense']} of {row['compared']}" if "compared" in row else "-"
        lines.append(
            f"| `{name}` | {row['tokens_per_s_median']:.2f} | {over} "
            f"| {', '.join(map(str, row['peak_running']))} | {row['fast_tier_bytes_per_turn']} "
            f"| {row['ttft_p50_s']:.2f} s | {same} | {row['same_every_repeat']} "
            f"| {row['shared_pages_per_turn']:g} "
            f"| {', '.join(map(str, row['peak_pages_used']))} |"
        )
    verified = {n: r for n, r in results["summary"].items() if r.get("passes")}
    if verified:
        lines += ["", "Verified decoding, over all runs: tokens decoded after each reply's "
                  "first (which its prefill gives), drafts, drafts dense agreed with, dense "
                  "passes, and rows (drafts and passes, batched or alone) per token decoded: "
                  "a row per token is unverified decoding's.", "",
                  "| policy | tokens decoded | drafts | accepted | passes | rows per token |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, row in verified.items():
            rows = (row["drafted"] + row["passes"]) / max(row["decoded"], 1)
            lines.append(f"| `{name}` | {row['decoded']} | {row['drafted']} | "
                         f"{row['accepted']} | {row['passes']} | {rows:.3f} |")  # fmt: skip
    if has_split(results):
        lines += time_lines(results)
    counts = {p: {k: ({part: round(x, 2) for part, x in v.items()} if isinstance(v, dict) else v)
                  for k, v in c.items()} for p, c in results["scheduler"].items()}  # fmt: skip
    lines += ["", f"Scheduler counts, per policy over all runs (seconds to 0.01): {counts}.", ""]
    return "\n".join(lines)


def measure(
    model: LoadedModel, policies: list[str], profile: Path | None, agents: int, context: int,
    new_tokens: int, budget_turns: float, repeats: int, texts: list[str],
) -> dict[str, Any]:  # fmt: skip
    """Every policy's runs, repeat by repeat (order rotated), and their summary."""
    doc = text_of_tokens(model, texts, context - QUESTION_ROOM - new_tokens)
    asks = prompts(doc, agents)
    e0 = Engine(model, EngineConfig(strategy="prefix"))
    prompt_tokens = max(e0.tokenize(a).num_tokens for a in asks)
    kv_bytes = budget_bytes(model, prompt_tokens, new_tokens, budget_turns)
    params = GenerationParams(max_new_tokens=new_tokens)
    configs = {p: DecodeConfig.from_spec(p.removesuffix(SHARED), profile=profile)
               for p in policies}  # fmt: skip
    engines = {p: engine(model, c, kv_bytes, p.endswith(SHARED)) for p, c in configs.items()}
    runs = []
    for rep in range(repeats):
        order = policies[rep % len(policies) :] + policies[: rep % len(policies)]
        for p in order:
            r = run(engines[p], asks, params)
            r |= {"repeat": rep, "policy": p, "load_avg": os.getloadavg()[0]}
            runs.append(r)
            print(f"rep {rep} {p:24s} {r['tokens_per_s']:6.2f} tok/s  at once "
                  f"{r['peak_running']:2d}  load {r['load_avg']:.2f}", flush=True)  # fmt: skip
    scheduler = {p: vars(e.batch.stats()) for p, e in engines.items() if e.batch is not None}
    pool_pages = next(iter(engines.values())).pool_config.num_pages
    return {"runs": runs, "summary": summarize(runs, policies), "prompt_tokens": prompt_tokens,
            "pool_bytes": kv_bytes, "pool_pages": pool_pages, "scheduler": scheduler}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=12)
    ap.add_argument("--context", type=int, default=4096, help="prompt + new tokens")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--budget-turns", type=float, default=4.0,
                    help="the KV pool: this many dense turns' pages")  # fmt: skip
    ap.add_argument("--policies", default="dense,flexicache,flexicache:verify=8")
    ap.add_argument("--profile", type=Path, default=None, help="head profile (sparse policies)")
    ap.add_argument("--workload", type=Path, default=WORKLOAD,
                    help="the workload whose texts make the document")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--render", action="store_true",
                    help="run nothing: write report.md and the plot again from --out's "
                         "results.json")  # fmt: skip
    args = ap.parse_args()
    if args.render:
        results = json.loads((args.out / "results.json").read_text(encoding="utf-8"))
        (args.out / "report.md").write_text(render(results, args.out), encoding="utf-8")
        return
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if policies[0] != "dense":
        ap.error("--policies must start with dense (the reference of every ratio)")
    torch.set_num_threads(args.threads)
    origin = provenance(script="benchmarks/server/kv_budget.py")
    model = load_model(None)
    out = measure(model, policies, args.profile, args.agents, args.context, args.new_tokens,
                  args.budget_turns, args.repeats, load_texts(args.workload))  # fmt: skip
    results = {"provenance": origin,
               "settings": vars(args) | {"out": str(args.out), "profile": str(args.profile),
                                         "workload": str(args.workload),
                                         "model": model.model_id, "greedy": True},
               **out}  # fmt: skip
    text = write_run(args.out, results, lambda r: render(r, args.out))
    print(text)


def render(results: dict[str, Any], out: Path) -> str:
    """The report, with the time-split plot written beside it where the results have one."""
    plot_time(results, out / "time_split.png")
    return report(results)


if __name__ == "__main__":
    main()
