"""The vLLM bench's summary, report and plot, from the runs of `agentcache.bench.vllm.run`.

Reported: TTFT per turn, the median over warm turns (every turn but each session's first), the
median per-turn ratio to `prefix` and to `none` with its spread and n, first-token agreement
and top-5 overlap against `none`. Every comparison pairs a turn with the same turn measured in
the same round (`agentcache.bench.vllm.pairs`).
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentcache.bench.stats import spread
from agentcache.bench.vllm.pairs import PAIRING, TurnKey, paired_ratios, turn_key

PAIRED_BASES = ("prefix", "none")  # ttft_vs_<base>_paired_<statistic> in the summary


def merge_rounds(config_rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration (in the order of round 0), one run over all its rounds: the records in
    round order (each carries its `round`), the median over rounds of the start-up time and of
    each fill cost estimate, and each round's own values under `per_round`."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for run in sorted(config_rounds, key=lambda run: run["round"]):
        by_config.setdefault(run["config"], []).append(run)
    return {config: _merged(runs) for config, runs in by_config.items()}


def _merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    costs: list[dict[str, float]] = [run.get("fill_costs", {}) for run in runs]
    names = sorted({k for c in costs for k in c})
    return {
        "startup_s": statistics.median(run["startup_s"] for run in runs),
        "fill_costs": {k: statistics.median(c[k] for c in costs if k in c) for k in names},
        "records": [r for run in runs for r in run["records"]],
        "per_round": [
            {"round": run["round"], "startup_s": run["startup_s"], "fill_costs_ms_per_token": c}
            for run, c in zip(runs, costs, strict=True)
        ],
    }


def summarize(runs: dict[str, Any], schedule: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The summary of `runs`, per configuration its records over every round (`merge_rounds`;
    a record without a `round` is of round 0). `schedule`: the order the configuration-rounds
    ran in, kept as given. Raises KeyError when `none` or `prefix` lacks a measured turn."""
    records = [r for run in runs.values() for r in run["records"]]
    ref = {turn_key(r): r for r in records if r["config"] == "none"}  # the fidelity reference
    configs = {c: _config_summary(c, run, records, ref) for c, run in runs.items()}
    return {
        "configs": configs,
        "records": records,
        "rounds": len({turn_key(r)[2] for r in records}),
        "pairing": PAIRING,
        "schedule": schedule or [],
        "command": " ".join(sys.argv),
    }


def _config_summary(
    config: str, run: dict[str, Any], records: list[dict[str, Any]], ref: dict[TurnKey, Any]
) -> dict[str, Any]:
    rows = run["records"]
    warm = [r for r in rows if r["turn"] > 0]
    paired = {base: paired_ratios(records, config, base) for base in PAIRED_BASES}
    vs_prefix = paired["prefix"]
    summary = {
        "startup_s": run["startup_s"],
        "turns": len({turn_key(r)[:2] for r in rows}),  # distinct turns, whatever the rounds
        "rounds": sorted({turn_key(r)[2] for r in rows}),
        "measured_turns": len(rows),
        "ttft_ms_median_warm": statistics.median(r["ttft_ms"] for r in warm),
        "ttft_ratio_vs_prefix_warm": statistics.median(vs_prefix),
        "first_token_agreement": statistics.fmean(
            float(r["first_token"] == ref[turn_key(r)]["first_token"]) for r in rows
        ),
        "top5_overlap": statistics.fmean(
            len(set(r["top5"]) & set(ref[turn_key(r)]["top5"])) / 5 for r in rows
        ),
        "claimed_fraction_warm": statistics.fmean(
            r["claimed_tokens"] / r["prompt_tokens"] for r in warm
        ),
        "fallbacks": sum(r["fallbacks"] for r in rows),
        "fill_costs_ms_per_token": run.get("fill_costs", {}),
        "fills_warm": _counts(r.get("fill") for r in warm if config.startswith("agentcache")),
        "by_workload": _by_workload(config, records),
        "n_pairs": len(vs_prefix),
    }
    for base, ratios in paired.items():
        summary |= {f"ttft_vs_{base}_paired_{k}": v for k, v in spread(ratios).items()}
    if "per_round" in run:
        summary["per_round"] = run["per_round"]
    return summary


def _counts(values: Iterable[str | None]) -> dict[str, int]:
    return dict(Counter(v for v in values if v))


def _workloads(results: dict[str, Any]) -> list[str]:
    """The workloads the summary has per-workload figures for, in name order."""
    return sorted({w for s in results["configs"].values() for w in s.get("by_workload", {})})


def _by_workload(config: str, records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per workload: the median warm TTFT ratio to `prefix` (same turn, same round) and how many
    warm turns were at least 2x faster than `prefix` (the vLLM target, turn by turn)."""
    names = sorted({r.get("workload") or "-" for r in records if r["config"] == config})
    out = {}
    for w in names:
        of_w = [r for r in records if (r.get("workload") or "-") == w]
        if ratios := paired_ratios(of_w, config, "prefix"):
            out[w] = {"warm_turns": len(ratios), "ttft_ratio_vs_prefix_warm":
                      statistics.median(ratios), "turns_at_least_2x_faster":
                      sum(x <= 0.5 for x in ratios)}  # fmt: skip
    return out


def report_head(results: dict[str, Any]) -> str:
    """The summary table and the round-paired ratios (what the command prints)."""
    return _summary_table(results) + "\n\n" + paired_section(results)


def report_markdown(results: dict[str, Any]) -> str:
    parts = [report_head(results), _workload_table(results), _turn_table(results)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _summary_table(results: dict[str, Any]) -> str:
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
    return "\n".join(lines)


def paired_section(results: dict[str, Any]) -> str:
    """Each configuration's warm TTFT over `prefix`'s and `none`'s: the median of per-turn
    ratios, each pairing turns of the same round, with IQR, range and n; the rounds' order."""
    rounds = results.get("rounds", 1)
    lines = [
        f"TTFT ratios paired within rounds ({rounds} round{'s' * (rounds != 1)}; {PAIRING}): "
        "warm turns, median (IQR; min-max) over turns and rounds.",
        "",
        "| config | TTFT / prefix | TTFT / none | pairs |",
        "|---|---|---|---|",
    ]
    for name, s in results["configs"].items():
        cells = [_spread_cell(s, f"ttft_vs_{base}_paired") for base in PAIRED_BASES]
        lines.append(f"| {name} | {' | '.join(cells)} | {s['n_pairs']} |")
    orders: dict[int, list[str]] = {}
    for item in sorted(results.get("schedule", []), key=lambda i: (i["round"], i["slot"])):
        orders.setdefault(item["round"], []).append(item["config"])
    if orders:
        lines += [
            "",
            "Order: " + "; ".join(f"round {r}: {', '.join(c)}" for r, c in orders.items()),
        ]
    return "\n".join(lines)


def _spread_cell(summary: dict[str, Any], prefix: str) -> str:
    s = {k: summary[f"{prefix}_{k}"] for k in ("median", "q25", "q75", "min", "max")}
    return f"{s['median']:.2f} ({s['q25']:.2f}-{s['q75']:.2f}; {s['min']:.2f}-{s['max']:.2f})"


def _workload_table(results: dict[str, Any]) -> str:
    workloads = _workloads(results)
    if not workloads:
        return ""
    lines = [
        "TTFT / prefix by workload (warm, median; turns >= 2x faster than prefix):",
        "",
        "| config | " + " | ".join(workloads) + " |",
        "|---|" + "---|" * len(workloads),
    ]
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
    return "\n".join(lines)


def _turn_table(results: dict[str, Any]) -> str:
    """TTFT ms of every turn, one row per turn and round."""
    lines = ["| session | turn | round | tokens | " + " | ".join(results["configs"]) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(results["configs"]))
    by_turn: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in sorted(results["records"], key=lambda r: turn_key(r)[2]):  # stable: round by round
        by_turn.setdefault(turn_key(r), {})[r["config"]] = r
    for (session, turn, rnd), row in by_turn.items():
        cells = " | ".join(f"{row[c]['ttft_ms']:.0f}" for c in results["configs"])
        tokens = next(iter(row.values()))["prompt_tokens"]
        lines.append(f"| {session} | {turn} | {rnd} | {tokens} | {cells} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Left: each configuration's warm median speed-up over `prefix`, per workload (the 2x
    target drawn). Right: every warm turn's TTFT against `prefix`'s on the same turn and round."""
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
    base = {turn_key(r): r["ttft_ms"] / 1e3 for r in results["records"] if r["config"] == "prefix"}
    top = max(base.values(), default=1.0)
    for config in configs:
        rows = [r for r in results["records"] if r["config"] == config and r["turn"] > 0]
        xs = [base[turn_key(r)] for r in rows]
        right.scatter(xs, [r["ttft_ms"] / 1e3 for r in rows], s=10, alpha=0.7, label=config)
        top = max([top, *xs])
    right.plot([0, top], [0, top], color="grey", lw=0.8, label="= prefix")
    right.plot([0, top], [0, top / 2], color="black", ls="--", lw=0.8, label="2x faster")
    right.set_xlabel("prefix TTFT (s), same turn and round")
    right.set_ylabel("TTFT (s)")
    right.set_title("every warm turn")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
