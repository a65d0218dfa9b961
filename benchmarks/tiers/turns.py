#!/usr/bin/env python3
"""Write amplification against session length, from `agentcache bench-tiers` results.

    python benchmarks/tiers/turns.py docs/bench/tiers/*/results.json \
        docs/bench/tiers/*/*/results.json --out docs/bench/tiers/long

Each results.json must hold the `slide` and `lru` policies. A run is placed by its workload
(the session names' prefix), its turns per session (the most turns any session ran) and
whether recomputed tokens were written back (`config.adopt`; runs that predate the option
wrote them back) and, when written back, how `slide` wrote its dirty pages: as deltas of
their stale token slots (results with `disk_delta_pages`) or whole (results that predate
deltas; their write amplification counted a dirty page whole in what had to be persisted,
too). Writes `DIR/wa_turns.md` (a table) and `DIR/wa_turns.png` (lru's write amplification
over slide's, per turns per session, the 3x target drawn across).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcache.bench.tiers.report import ratios, read_results, report_runs

TARGET = 3.0


@dataclass(frozen=True)
class Run:
    path: str
    workload: str
    turns: int
    writeback: bool
    deltas: bool  # slide wrote dirty pages as deltas (False: whole, or no write-back)
    reduction: float  # lru's write amplification / slide's
    calls_ratio: float  # lru's write calls / slide's
    throughput_ratio: float  # slide's turns/s / lru's


def load(path: Path) -> Run:
    return read_results(path, _load)


def _load(path: Path, data: dict[str, Any]) -> Run:
    pol = data["policies"]
    workloads = {s.rsplit("-", 1)[0] for s in data.get("sessions", [])}
    if len(workloads) != 1:
        raise ValueError(f"{path}: needs the sessions of one workload, got {sorted(workloads)}")
    turns = 1 + max(t["turn"] for p in ("slide", "lru") for t in pol[p]["turns"])
    adopt = data.get("config", {}).get("adopt")
    writeback = adopt is None or bool(adopt)
    r = ratios({"slide": pol["slide"], "lru": pol["lru"]})["slide"]
    keys = ("write_amplification_reduction", "write_calls_ratio", "throughput_ratio")
    undefined = [k for k in keys if not r[k]]
    if undefined:
        raise ValueError(f"{path}: {', '.join(undefined)} undefined (a zero in its results)")
    return Run(
        path=str(path),
        workload=workloads.pop(),
        turns=turns,
        writeback=writeback,
        deltas=writeback and "disk_delta_pages" in pol["slide"],
        reduction=r["write_amplification_reduction"],
        calls_ratio=1 / r["write_calls_ratio"],
        throughput_ratio=r["throughput_ratio"],
    )


def table(runs: list[Run]) -> str:
    rows = [
        "| workload | write-back | dirty pages written | turns per session | WA lru / slide "
        "| write calls lru / slide | turns/s slide / lru | results |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r.workload, not r.writeback, not r.deltas, r.turns)):
        met = " (>= 3x)" if r.reduction >= TARGET else ""
        rows.append(
            f"| {r.workload} | {'yes' if r.writeback else 'no'} | {_mode(r)} | {r.turns} | "
            f"{r.reduction:.2f}x{met} | {r.calls_ratio:.0f}x | {r.throughput_ratio:.2f}x | "
            f"`{r.path}` |"
        )
    return "\n".join(rows) + "\n"


def _mode(r: Run) -> str:
    return "-" if not r.writeback else "as deltas" if r.deltas else "whole"


def _label(writeback: bool, deltas: bool) -> str:
    if not writeback:
        return "no write-back"
    return "write-back, deltas" if deltas else "write-back, whole pages"


def plot(runs: list[Run], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    groups: dict[tuple[str, bool, bool], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.workload, r.writeback, r.deltas), []).append(r)
    colors = {"memgpt": "tab:blue", "reflexion": "tab:orange", "swe_agent": "tab:green"}
    styles = {(True, True): "-", (True, False): "-.", (False, False): "--"}
    for (workload, writeback, deltas), rs in sorted(groups.items()):
        by_turns: dict[int, list[float]] = {}
        for r in rs:
            by_turns.setdefault(r.turns, []).append(r.reduction)
        xs = sorted(by_turns)
        ys = [sum(by_turns[x]) / len(by_turns[x]) for x in xs]
        ax.plot(
            xs,
            ys,
            linestyle=styles[(writeback, deltas)],
            color=colors.get(workload, "tab:gray"),
            markerfacecolor=None if deltas else "white",
            marker="o" if writeback else "s",
            label=f"{workload}, {_label(writeback, deltas)}",
        )
    ax.axhline(TARGET, color="black", linewidth=0.8, linestyle=":")
    ax.text(ax.get_xlim()[0], TARGET, " 3x target", va="bottom", fontsize=8)
    ax.set_xlabel("turns per session")
    ax.set_ylabel("write amplification, lru / slide")
    ax.set_title("Spill write amplification against session length (batch 8)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    return report_runs(argv, __doc__.split("\n")[0], load, table, plot, "wa_turns")


if __name__ == "__main__":
    raise SystemExit(main())
