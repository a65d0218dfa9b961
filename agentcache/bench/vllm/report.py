"""The vLLM bench's summary, report and plot, from the runs of `agentcache.bench.vllm.run`.

Reported: TTFT per turn, the median over warm turns (every turn but each session's first), the
median per-turn ratio to `prefix`, first-token agreement and top-5 overlap against `none`.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    records = [r for run in runs.values() for r in run["records"]]
    ref = {(r["session"], r["turn"]): r for r in records if r["config"] == "none"}
    base = {(r["session"], r["turn"]): r for r in records if r["config"] == "prefix"}
    summary = {}
    for config, run in runs.items():
        rows = run["records"]
        warm = [r for r in rows if r["turn"] > 0]
        key = [(r["session"], r["turn"]) for r in warm]
        summary[config] = {
            "startup_s": run["startup_s"],
            "turns": len(rows),
            "ttft_ms_median_warm": statistics.median(r["ttft_ms"] for r in warm),
            "ttft_ratio_vs_prefix_warm": statistics.median(
                r["ttft_ms"] / base[k]["ttft_ms"] for r, k in zip(warm, key, strict=True)
            ),
            "first_token_agreement": statistics.fmean(
                float(r["first_token"] == ref[(r["session"], r["turn"])]["first_token"])
                for r in rows
            ),
            "top5_overlap": statistics.fmean(
                len(set(r["top5"]) & set(ref[(r["session"], r["turn"])]["top5"])) / 5 for r in rows
            ),
            "claimed_fraction_warm": statistics.fmean(
                r["claimed_tokens"] / r["prompt_tokens"] for r in warm
            ),
            "fallbacks": sum(r["fallbacks"] for r in rows),
            "fill_costs_ms_per_token": run.get("fill_costs", {}),
            "fills_warm": _counts(r.get("fill") for r in warm if config.startswith("agentcache")),
            "by_workload": _by_workload(warm, base),
        }
    return {"configs": summary, "records": records, "command": " ".join(sys.argv)}


def _counts(values: Iterable[str | None]) -> dict[str, int]:
    return dict(Counter(v for v in values if v))


def _workloads(results: dict[str, Any]) -> list[str]:
    """The workloads the summary has per-workload figures for, in name order."""
    return sorted({w for s in results["configs"].values() for w in s.get("by_workload", {})})


def _by_workload(
    warm: list[dict[str, Any]], base: dict[tuple[str, int], dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per workload: the median warm TTFT ratio to `prefix` and how many warm turns were at
    least 2x faster than `prefix` (the vLLM target, turn by turn)."""
    ratios: dict[str, list[float]] = {}
    for r in warm:
        ratios.setdefault(r.get("workload") or "-", []).append(
            r["ttft_ms"] / base[(r["session"], r["turn"])]["ttft_ms"]
        )
    return {
        w: {"warm_turns": len(v), "ttft_ratio_vs_prefix_warm": statistics.median(v),
            "turns_at_least_2x_faster": sum(x <= 0.5 for x in v)}
        for w, v in ratios.items()
    }  # fmt: skip


def report_markdown(results: dict[str, Any]) -> str:
    lines = [
        "| config | warm TTFT ms (median) | TTFT / prefix (warm, median) | first-token agreement "
        "vs none | top-5 overlap | claimed / prompt (warm) | fallbacks |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in results["configs"].items():
        lines.append(
            f"| {name} | {s['ttft_ms_median_warm']:.0f} | {s['ttft_ratio_vs_prefix_warm']:.2f} | "
            f"{s['first_token_agreement']:.2f} | {s['top5_overlap']:.2f} | "
            f"{s['claimed_fraction_warm']:.2f} | {s['fallbacks']} |"
        )
    workloads = _workloads(results)
    if workloads:
        lines += ["", "TTFT / prefix by workload (warm, median; turns >= 2x faster than "
                  "prefix):", "", "| config | " + " | ".join(workloads) + " |",
                  "|---|" + "---|" * len(workloads)]  # fmt: skip
        for name, c in results["configs"].items():
            shares = []
            for w in workloads:
                b = c.get("by_workload", {}).get(w)
                shares.append(
                    f"{b['ttft_ratio_vs_prefix_warm']:.2f} ({b['turns_at_least_2x_faster']} of "
                    f"{b['warm_turns']})"
                    if b
                    else "-"
                )
            lines.append(f"| {name} | " + " | ".join(shares) + " |")
    lines += ["", "| session | turn | tokens | " + " | ".join(results["configs"]) + " |"]
    lines.append("|---|---|---|" + "---|" * len(results["configs"]))
    by_turn: dict[tuple[str, int], dict[str, Any]] = {}
    for r in results["records"]:
        by_turn.setdefault((r["session"], r["turn"]), {})[r["config"]] = r
    for (session, turn), row in by_turn.items():
        cells = " | ".join(f"{row[c]['ttft_ms']:.0f}" for c in results["configs"])
        tokens = next(iter(row.values()))["prompt_tokens"]
        lines.append(f"| {session} | {turn} | {tokens} | {cells} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Left: each configuration's warm median speed-up over `prefix`, per workload (the 2x
    target drawn). Right: every warm turn's TTFT against `prefix`'s on the same turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [c for c in results["configs"] if c != "prefix"]
    workloads = _workloads(results) or ["-"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(configs), 1)
    for i, config in enumerate(configs):
        by = results["configs"][config].get("by_workload", {})
        xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(workloads))]
        ys = [1 / by[w]["ttft_ratio_vs_prefix_warm"] if w in by else 0.0 for w in workloads]
        left.bar(xs, ys, width=width, label=config)
    left.axhline(1.0, color="grey", lw=0.8)
    left.axhline(2.0, color="black", ls="--", lw=0.8, label="2x target")
    left.set_xticks(range(len(workloads)), workloads)
    left.set_ylabel("prefix TTFT / TTFT (warm turns, median)")
    left.set_title("speed-up over vLLM prefix caching")
    left.legend(fontsize=8)
    base = {
        (r["session"], r["turn"]): r["ttft_ms"] / 1e3
        for r in results["records"]
        if r["config"] == "prefix"
    }
    top = max(base.values(), default=1.0)
    for config in configs:
        rows = [r for r in results["records"] if r["config"] == config and r["turn"] > 0]
        xs = [base[(r["session"], r["turn"])] for r in rows]
        right.scatter(xs, [r["ttft_ms"] / 1e3 for r in rows], s=10, alpha=0.7, label=config)
        top = max([top, *xs])
    right.plot([0, top], [0, top], color="grey", lw=0.8, label="= prefix")
    right.plot([0, top], [0, top / 2], color="black", ls="--", lw=0.8, label="2x faster")
    right.set_xlabel("prefix TTFT (s), same turn")
    right.set_ylabel("TTFT (s)")
    right.set_title("every warm turn")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
