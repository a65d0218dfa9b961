"""results.json, report.md and PNG plots for a bench run."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agentcache.argtypes import path_arg
from agentcache.bench.peer import PEER
from agentcache.bench.provenance import machine, provenance, specs_of
from agentcache.bench.reuse.metrics import _median, aggregate

COLUMNS = (
    ("ttft_ratio_vs_full", "TTFT/full", "{:.3f}"),
    ("ttft_ratio_vs_limit", "TTFT/limit", "{:.2f}"),
    ("recompute_fraction_mean", "compute", "{:.3f}"),
    ("kl_first_token_mean", "KL first", "{:.2e}"),
    ("tf_kl_mean", "KL tf", "{:.2e}"),
    ("tf_top1_agreement", "top1 tf", "{:.3f}"),
    ("first_token_agreement", "first tok", "{:.3f}"),
    ("greedy_exact_match", "greedy exact", "{:.3f}"),
    ("greedy_agree_prefix_mean", "agree len", "{:.1f}"),
    ("top5_overlap_mean", "top5", "{:.2f}"),
    ("ttft_ms_median", "TTFT ms", "{:.0f}"),
    ("overhead_ms_median", "overhead ms", "{:.1f}"),
)


def warm(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's first turn finds nothing cached for any strategy: summaries use the later
    (warm) turns when there are any."""
    later = [r for r in records if r["turn"] > 0]
    return later or records


def summarize(records: list[dict[str, Any]], key: str | None = None) -> dict[str, Any]:
    """Aggregate warm turns per strategy, optionally split by a record field (case, workload)."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in warm(records):
        groups.setdefault(r[key] if key else "", {}).setdefault(r["strategy"], []).append(r)
    out = {g: {s: _summary(rs) for s, rs in by.items()} for g, by in groups.items()}
    return out[""] if key is None else out


def exact_turn(row: dict[str, Any]) -> bool:
    """Whether a turn of the default computed every reused token whose context changed
    (`cover` acted, or there was no candidate to rank)."""
    return bool(row["probe_skipped"] or row["candidates"] == 0)


def covered_at(row: dict[str, Any], cover: float) -> bool:
    """Whether `rpdc` with `cover` would compute every candidate of a turn recorded without
    cover: at most `cover` candidates per token computed anyway (or no probe ran)."""
    return bool(row["candidates"] <= cover * row["computed_anyway"] or row["probe_skipped"])


def exact_compute(row: dict[str, Any]) -> float:
    """The share of the prompt a turn recorded without cover computes when it computes every
    candidate (the tokens computed anyway and the candidates)."""
    return float((row["computed_anyway"] + row["candidates"]) / row["prompt_tokens"])


def peer_ratios(records: list[dict[str, Any]], peer: str = PEER) -> dict[str, float]:
    """Per strategy, the median over warm turns of its TTFT / the `transformers-prefix` peer's
    on the same turn (what a user would hand-roll in `transformers`); empty without the peer."""
    key = ("session", "workload", "turn")
    turns = warm(records)
    theirs = {tuple(r[k] for k in key): r["ttft_ms"] for r in turns if r["strategy"] == peer}
    by: dict[str, list[float]] = {}
    for r in turns:
        t = theirs.get(tuple(r[k] for k in key))
        if t:
            by.setdefault(r["strategy"], []).append(r["ttft_ms"] / t)
    return {s: _median(v) for s, v in by.items()}


def with_peer_ratios(
    summary: dict[str, dict[str, Any]], ratios: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """The summary with each strategy's `ttft_ratio_vs_peer` (absent: no peer in the run)."""
    return {
        s: v | ({"ttft_ratio_vs_peer": ratios[s]} if s in ratios else {})
        for s, v in summary.items()
    }


def cold(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per strategy, TTFT / `full`'s on each session's first turn (nothing to reuse yet): what
    a new conversation pays for a strategy before it can reuse anything. `added_median` /
    `added_max`: its overhead less `full`'s on the same turn, as a share of `full`'s TTFT,
    the same tax read without the noise of timing two whole prefills (absent for the peer,
    which reports no overhead)."""
    first = [r for r in records if r["turn"] == 0 and r["ttft_full_ms"] > 0]
    full_overhead = {
        (r.get("workload"), r.get("session")): r["overhead_ms"]
        for r in first
        if r["strategy"] == "full" and "overhead_ms" in r
    }
    by: dict[str, list[float]] = {}
    added: dict[str, list[float]] = {}
    for r in first:
        by.setdefault(r["strategy"], []).append(r["ttft_ms"] / r["ttft_full_ms"])
        base = full_overhead.get((r.get("workload"), r.get("session")))
        if base is not None and "overhead_ms" in r:
            tax = (r["overhead_ms"] - base) / r["ttft_full_ms"]
            added.setdefault(r["strategy"], []).append(tax)
    out: dict[str, dict[str, float]] = {}
    for s, v in by.items():
        out[s] = {"median": _median(v), "max": max(v), "turns": len(v)}
        if added.get(s):
            out[s] |= {"added_median": _median(added[s]), "added_max": max(added[s])}
    return out


KL_TIE = 1e-9  # KLs closer than this are equal (exact reuse measures ~1e-11 of float noise)


def dominated_by(summary: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """For each strategy, the others at or below both its TTFT/full and its compute with a
    lower teacher-forced KL (the test the default must pass on every family)."""
    out: dict[str, list[str]] = {}
    for name, s in summary.items():
        out[name] = [
            other
            for other, o in summary.items()
            if other != name
            and o["ttft_ratio_vs_full"] <= s["ttft_ratio_vs_full"]
            and o["recompute_fraction_mean"] <= s["recompute_fraction_mean"]
            and o["tf_kl_mean"] < s["tf_kl_mean"] - KL_TIE
        ]
    return out


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """`aggregate`, plus the median time a strategy spent besides computing tokens (NaN for
    records written before it was measured)."""
    overhead = _median(r["overhead_ms"] for r in records if "overhead_ms" in r)
    return aggregate(records) | {"overhead_ms_median": overhead}


def write_results(
    out: Path, records: list[dict[str, Any]], meta: dict[str, Any], problems: list[str]
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    strategies = with_peer_ratios(summarize(records), peer_ratios(records))
    results = {
        "strategies": strategies,
        "by_case": summarize(records, "case"),
        "by_workload": summarize(records, "workload"),
        "cksim_by_layer": _cksim(records),
        "cold": cold(records),
        "machine": machine(),
        "skipped_lines": problems,
        **meta,
        "provenance": provenance(
            specs_of(r["strategy"] for r in records), meta.get("split"), meta.get("sessions", ())
        ),
        "turns": records,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_json_default))
    (out / "report.md").write_text(render_markdown(results))
    plot(results, out)
    return results


def agreement(rows: list[dict[str, Any]]) -> dict[str, float | int]:
    """Over per-turn records: their number, the shares whose greedy continuation and first
    token equal `full`'s, and the mean share of the prompt computed (NaN where there are none)."""
    n = len(rows)
    nan = float("nan")
    return {
        "n": n,
        "greedy": sum(r["greedy_exact_match"] for r in rows) / n if n else nan,
        "first_token": sum(r["first_token_agreement"] for r in rows) / n if n else nan,
        "compute": statistics.fmean(r["recompute_fraction"] for r in rows) if n else nan,
    }


def replay_args(argv: list[str] | None, doc: str, root: Path) -> argparse.Namespace:
    """A replay script's arguments: `--root` (where the stored runs are, `root` by default)
    and `--out` (the folder for results.json and report.md)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--root", type=path_arg, default=root)
    p.add_argument("--out", type=path_arg, required=True, help="folder for results.json, report.md")
    return p.parse_args(argv)


def write_replay(
    out: Path, lines: Sequence[str], grid: Sequence[float], settings: dict[str, Any],
    held: dict[str, bool], chosen: float | None, families: Any, validation: Any,
) -> None:  # fmt: skip
    """A choice replayed on stored tuning runs: results.json (the grid, the settings it was
    replayed under, which values held, the one chosen, per family and on validation) and
    `lines` as report.md, whose third line is its command; the report is also printed."""
    record = {"split": "tune", "command": lines[2].strip("`"), "grid": list(grid), **settings,
              "no_loss": held, "chosen": chosen, "families": families,
              "validation": validation}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    print(text)


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


def _cksim(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    by: dict[str, list[list[float]]] = {}
    for r in warm(records):
        by.setdefault(r["strategy"], []).append(r["cksim_by_layer"])
    return {s: [sum(col) / len(col) for col in zip(*rows, strict=True)] for s, rows in by.items()}


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table: the header row, its rule, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def table(summary: dict[str, dict[str, float]]) -> str:
    header = ["strategy", *(c[1] for c in COLUMNS), "turns"]
    rows = (
        [name, *(fmt.format(s[k]) for k, _, fmt in COLUMNS), str(s["turns"])]
        for name, s in summary.items()
    )
    return markdown_table(header, rows)


def scope_line(results: dict[str, Any]) -> str:
    """What a run measured: the split, its sessions and turns (warm turns in the tables)."""
    if "split" not in results:  # results written before runs recorded their split
        return "Split: not recorded."
    turns = results["num_turns"]
    warm_turns = turns - results["num_sessions"]
    return (
        f"Split: {results['split']} ({', '.join(results['splits_measured'])} sessions); "
        f"{results['num_sessions']} sessions, {turns} turns ({warm_turns} warm)."
    )


def render_markdown(results: dict[str, Any]) -> str:
    parts = [
        "# agentcache bench report",
        "",
        scope_line(results),
        "",
        f"Model `{results.get('model')}`; default strategy `{results.get('default_strategy')}`; "
        f"{results['machine']['cores']} cores, "
        f"{results['machine']['torch_threads']} torch threads.",
        "",
        f"Command: `{results.get('command')}`",
        "",
        "TTFT ratios are medians over turns of (strategy TTFT / `full` TTFT on the same turn); "
        "limit = only update tokens computed with all other KV resident. compute = token-layers "
        "computed / `full`'s. overhead: median time a prefill spent besides computing tokens "
        "(lookup, loading, re-rotation, assembling K/V, probe scoring, ranking). "
        "KL tf / top1 tf: teacher-forced along `full`'s greedy continuation. "
        "Summaries cover warm turns: each session's first turn, where nothing is cached for any "
        "strategy, is in results.json but not in the tables.",
        "",
        "## All turns",
        "",
        table(results["strategies"]),
    ]
    parts += _dominance_lines(results["strategies"])
    ratios = {k: v["ttft_ratio_vs_peer"] for k, v in results["strategies"].items()
              if "ttft_ratio_vs_peer" in v}  # fmt: skip
    if ratios:
        parts += ["", f"TTFT / `{PEER}`'s on the same warm turn (median): "
                  + ", ".join(f"`{k}` {v:.2f}" for k, v in ratios.items()) + "."]  # fmt: skip
    if results.get("cold"):
        parts += ["", "## Cold turns", "", _cold_sentence(results["cold"])]
    for key, title in (("by_case", "case"), ("by_workload", "workload")):
        for group, summary in sorted(results[key].items()):
            parts += ["", f"## {title}: {group or 'unlabelled'}", "", table(summary)]
    parts += ["", "![TTFT](ttft_ratio.png)", "", "![Pareto](fidelity_vs_ttft.png)"]
    if any(":" in s for s in results["strategies"]):
        parts += ["", "![Sweep](sweep.png)"]
    if results["skipped_lines"]:
        parts += ["", "## Skipped workload lines", ""] + [
            f"- {p}" for p in results["skipped_lines"]
        ]
    return "\n".join(parts) + "\n"


def _dominance_lines(summary: dict[str, dict[str, float]]) -> list[str]:
    """Which strategies another one beats on TTFT, compute and KL at once (warm turns)."""
    beaten = {k: v for k, v in dominated_by(summary).items() if v}
    if not beaten:
        return ["", "No strategy is dominated by another (TTFT/full and compute at or below, "
                "KL tf lower)."]  # fmt: skip
    return ["", "Dominated (another has TTFT/full and compute at or below, KL tf lower): "
            + "; ".join(f"`{k}` by {', '.join(f'`{o}`' for o in v)}" for k, v in beaten.items())
            + "."]  # fmt: skip


def _cold_sentence(cold_turns: dict[str, dict[str, float]]) -> str:
    parts = [f"`{s}` {c['median']:.2f} (max {c['max']:.2f})" for s, c in cold_turns.items()]
    n = max(c["turns"] for c in cold_turns.values())
    text = (
        f"TTFT / `full`'s on each session's first turn, where nothing is cached (median of {n}): "
        + ", ".join(parts)
        + "."
    )
    added = [
        f"`{s}` {c['added_median']:+.2%} (max {c['added_max']:+.2%})"
        for s, c in cold_turns.items()
        if "added_median" in c and s != "full"
    ]
    if added:
        text += (
            " What each spends besides computing tokens, less `full`'s own on the same turn, as a"
            " share of `full`'s TTFT (median, max): " + ", ".join(added) + "."
        )
    return text


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = results["strategies"]
    names = [n for n in summary if ":" not in n]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(names, [summary[n]["ttft_ratio_vs_full"] for n in names], color="tab:blue")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_ylabel("median TTFT / full (lower is better)")
    ax.set_title("Time to first token relative to full recompute")
    fig.tight_layout()
    fig.savefig(out / "ttft_ratio.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 5))
    for n in names:
        s = summary[n]
        if n == "full":
            continue
        ax.scatter(s["ttft_ratio_vs_full"], max(s["tf_kl_mean"], 1e-7), s=60)
        ax.annotate(n, (s["ttft_ratio_vs_full"], max(s["tf_kl_mean"], 1e-7)), fontsize=9)
    ax.set_yscale("log")
    ax.set_xlabel("median TTFT / full")
    ax.set_ylabel("teacher-forced KL vs full (log)")
    ax.set_title("Fidelity vs TTFT (down-left is better)")
    fig.tight_layout()
    fig.savefig(out / "fidelity_vs_ttft.png", dpi=120)
    plt.close(fig)

    families: dict[str, list[tuple[float, float, str]]] = {}
    for n, s in summary.items():
        fam = n.split(":")[0]
        if fam in ("full", "prefix", "promptcache"):
            continue
        families.setdefault(fam, []).append((s["recompute_fraction_mean"], s["tf_kl_mean"], n))
    if any(len(v) > 1 for v in families.values()):
        fig, ax = plt.subplots(figsize=(7, 5))
        for fam, pts in families.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [max(p[1], 1e-7) for p in pts], "o-", label=fam)
            for x, y, n in pts:
                ax.annotate(n.partition(":")[2], (x, max(y, 1e-7)), fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("recompute fraction (token-layers / full)")
        ax.set_ylabel("teacher-forced KL vs full (log)")
        ax.set_title("Budget sweeps: fidelity per unit of compute")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=120)
        plt.close(fig)
