#!/usr/bin/env python3
"""Throughput of `slide` against `lru` across `agentcache bench-tiers` runs, with the bound
that compute sets on it.

    python benchmarks/tiers/throughput.py $(find docs/bench/tiers -name results.json) \
        --out docs/bench/tiers/throughput

Each results.json must hold the `slide` and `lru` policies. Per run: slide's turns/s over
lru's, over every round and over the warm rounds alone (a batch's first round has nothing to
reuse and costs the same under both), the std ratios likewise, the store alone (the rounds'
store calls replayed without the model) and, for runs with a replay, the bound: the ratio a
policy whose store took no time would reach, lru's rounds' seconds over the same less lru's
store-only seconds (`agentcache.bench.tiers.report.throughput_bound`). Writes `DIR/throughput.md`
(a table) and `DIR/throughput.png` (the ratios per run, the 1.4x target drawn across).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcache.bench.tiers.report import ratios, read_results, report_runs, round_figures

TARGET = 1.4


@dataclass(frozen=True)
class Run:
    path: str
    workloads: str  # the sessions' workloads, "+"-joined
    turns: int  # the most turns any session ran
    lru_rounds_s: float
    ratio: float  # slide's turns/s / lru's, every round
    warm_ratio: float | None  # the same over rounds after each batch's first
    std_ratio: float | None
    warm_std_ratio: float | None
    store_only_ratio: float | None  # the store alone, replayed without the model
    bound: float | None  # the most any policy could reach against lru (needs a replay)


def load(path: Path) -> Run:
    return read_results(path, _load)


def _load(path: Path, data: dict[str, Any]) -> Run:
    pol = data["policies"]
    # results that predate the warm figures are completed from their rounds
    both = {p: {**pol[p], **round_figures(pol[p]["rounds"])} for p in ("slide", "lru")}
    r = ratios(both)["slide"]
    if not r["throughput_ratio"]:
        raise ValueError(f"{path}: throughput_ratio undefined (a zero in its results)")
    workloads = sorted({s.rsplit("-", 1)[0] for s in data.get("sessions", [])})
    return Run(
        path=str(path),
        workloads="+".join(workloads) or "?",
        turns=1 + max(x["turn"] for x in both["lru"]["rounds"]),
        lru_rounds_s=both["lru"]["rounds_s"],
        ratio=r["throughput_ratio"],
        warm_ratio=r["warm_throughput_ratio"],
        std_ratio=r["throughput_std_ratio"],
        warm_std_ratio=r["warm_throughput_std_ratio"],
        store_only_ratio=r["store_only_throughput_ratio"],
        bound=r["throughput_bound"],
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(runs: list[Run]) -> str:
    rows = [
        "| workloads | turns per session | lru rounds s | turns/s slide / lru | warm rounds "
        "| std slide / lru | warm std | store alone | bound (store free) | results |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r.workloads, r.turns, r.path)):
        rows.append(
            f"| {r.workloads} | {r.turns} | {r.lru_rounds_s:.0f} | {_x(r.ratio)} | "
            f"{_x(r.warm_ratio)} | {_x(r.std_ratio)} | {_x(r.warm_std_ratio)} | "
            f"{_x(r.store_only_ratio)} | {_x(r.bound)} | `{r.path}` |"
        )
    return "\n".join(rows) + "\n"


def plot(runs: list[Run], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(runs, key=lambda r: (r.workloads, r.turns, r.path))
    xs = range(len(runs))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(runs) + 3), 4.4))
    ax.bar([x - 0.2 for x in xs], [r.ratio for r in runs], 0.4, label="every round")
    ax.bar([x + 0.2 for x in xs], [r.warm_ratio or 0.0 for r in runs], 0.4, label="warm rounds")
    bounded = [(x, r.bound) for x, r in zip(xs, runs, strict=True) if r.bound is not None]
    if bounded:
        ax.scatter([x for x, _ in bounded], [b for _, b in bounded], marker="_", s=400,
                   color="black", zorder=3, label="bound: lru's store taking no time")  # fmt: skip
    ax.axhline(TARGET, color="tab:red", linestyle="--", label=f"target {TARGET}x")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    names = _run_names(runs)
    ax.set_xticks(list(xs), [f"{n}\n{r.turns} turns" for n, r in zip(names, runs, strict=True)],
                  fontsize=7, rotation=60, ha="right")  # fmt: skip
    ax.set_ylabel("turns/s, slide / lru")
    ax.set_ylim(0, max(1.6, *(r.warm_ratio or 0.0 for r in runs)) * 1.05)
    ax.set_title("Throughput at batch 8 under spill pressure, with the model", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _run_names(runs: list[Run]) -> list[str]:
    """Each run's folder, less the folders every run shares."""
    parents = [Path(r.path).parent.parts for r in runs]
    common = 0
    while all(len(p) > common + 1 and p[common] == parents[0][common] for p in parents):
        common += 1
    return ["/".join(p[common:]) or r.workloads for p, r in zip(parents, runs, strict=True)]


def main(argv: list[str] | None = None) -> int:
    return report_runs(argv, __doc__.split("\n")[0], load, table, plot, "throughput")


if __name__ == "__main__":
    sys.exit(main())
