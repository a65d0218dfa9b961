"""Greedy exact match against TTFT across budgets, on every warm turn of several bench runs.

Runs of `agentcache bench` over the same workload files (different strategy lists, e.g. the
default and `pic` in one run, larger budgets in another) are pooled per strategy: fidelity is
measured against `full`, which is deterministic, so it compares across runs; TTFT is taken as
each turn's ratio to the limit (a perfect cache) measured in the same run. The script checks
that every run covers the same turns and refuses to mix different ones.

    python benchmarks/reuse/budget_curve.py docs/bench/wide-*/results.json \
        --out docs/bench/wide-budget-curve

Writes `budget.md` (one row per strategy, all workloads, then per workload) and `budget.png`
(greedy exact match and teacher-forced KL against median TTFT / limit, one point per
strategy and workload, pooled over all workloads in the larger points).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from agentcache.bench.reuse.metrics import aggregate

Row = dict[str, Any]
Summary = dict[str, float]  # agentcache.bench.reuse.metrics.aggregate of one strategy's rows


def load(paths: list[Path]) -> dict[str, list[Row]]:
    """Warm-turn records per strategy label, pooled over runs; each run's turn set checked."""
    by_strategy: dict[str, list[Row]] = defaultdict(list)
    turn_sets: dict[str, set[tuple[str, int, int]]] = {}
    for path in paths:
        turns = json.loads(path.read_text())["turns"]
        for r in turns:
            if r["turn"] == 0:  # cold: nothing stored yet, every strategy is full
                continue
            key = (r["session"], r["turn"], r["prompt_tokens"])
            turn_sets.setdefault(r["workload"], set())
            if r["strategy"] == "full":
                turn_sets[r["workload"]].add(key)
            by_strategy[r["strategy"]].append(r)
    for label, rows in by_strategy.items():
        for workload in {r["workload"] for r in rows}:
            seen = {(r["session"], r["turn"], r["prompt_tokens"]) for r in rows
                    if r["workload"] == workload}  # fmt: skip
            if label != "full" and not seen <= turn_sets[workload]:
                raise SystemExit(f"{label} on {workload}: turns that no `full` run covers")
    return by_strategy


def groups(by_strategy: dict[str, list[Row]]) -> Iterator[tuple[str, list[tuple[Summary, str]]]]:
    """("all" then each workload, [(summary, strategy label)] sorted by TTFT / limit)."""
    workloads = sorted({r["workload"] for rows in by_strategy.values() for r in rows})
    for workload in ["all", *workloads]:
        stats = []
        for label, rows in by_strategy.items():
            sel = [r for r in rows if workload == "all" or r["workload"] == workload]
            if label != "full" and sel:
                stats.append((aggregate(sel), label))
        yield workload, sorted(stats, key=lambda x: x[0]["ttft_ratio_vs_limit"])


def table(by_strategy: dict[str, list[Row]]) -> str:
    head = "| workload | strategy | warm turns | TTFT/limit | TTFT/full | compute | first token "
    head += "| greedy exact | KL first | KL tf |\n|---|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for workload, stats in groups(by_strategy):
        for s, label in stats:
            matched = round(s["greedy_exact_match"] * s["turns"])
            lines.append(
                f"| {workload} | {label} | {s['turns']} | {s['ttft_ratio_vs_limit']:.2f} | "
                f"{s['ttft_ratio_vs_full']:.2f} | {s['recompute_fraction_mean']:.2f} | "
                f"{s['first_token_agreement']:.3f} | {s['greedy_exact_match']:.2f} ({matched}) | "
                f"{s['kl_first_token_mean']:.1e} | {s['tf_kl_mean']:.1e} |"
            )
    return head + "\n".join(lines) + "\n"


def plot(by_strategy: dict[str, list[Row]], path: Path) -> None:
    fig, (ax_g, ax_k) = plt.subplots(1, 2, figsize=(11, 4.2))
    for workload, pts in groups(by_strategy):
        # points, not lines: the strategies are different methods, not one budget knob
        style = {"ls": "none", "marker": "o", "ms": 8 if workload == "all" else 5}
        xs = [p[0]["ttft_ratio_vs_limit"] for p in pts]
        ax_g.plot(xs, [p[0]["greedy_exact_match"] for p in pts], label=workload, **style)
        ax_k.plot(xs, [p[0]["tf_kl_mean"] for p in pts], label=workload, **style)
        if workload == "all":
            for s, label in pts:
                xy = (s["ttft_ratio_vs_limit"], s["greedy_exact_match"])
                ax_g.annotate(label, xy, fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax_g.axhline(0.9, color="grey", ls="--", lw=0.8)
    ax_g.axvline(1.3, color="grey", ls=":", lw=0.8)
    ax_k.axvline(1.3, color="grey", ls=":", lw=0.8)
    ax_g.set(xlabel="median TTFT / limit (perfect cache)", ylabel="greedy exact match (32 tokens)")
    ax_k.set(xlabel="median TTFT / limit (perfect cache)", ylabel="teacher-forced KL vs full",
             yscale="log")  # fmt: skip
    for ax in (ax_g, ax_k):
        ax.grid(alpha=0.3)
    ax_g.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    by_strategy = load(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(by_strategy)
    (args.out / "budget.md").write_text(text)
    plot(by_strategy, args.out / "budget.png")
    print(text)


if __name__ == "__main__":
    main()
