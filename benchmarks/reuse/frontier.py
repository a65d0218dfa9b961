"""Fidelity-vs-compute frontier from `agentcache bench` results.

Reads one or more results.json files (each from a run that swept settings of several
strategies), and for every workload and case:

- plots teacher-forced KL against recompute fraction, one colour per strategy family
  (`rpdc`, `rpdc:ratio=0.15`, ... are one family), on a log scale, each family's points
  joined along its lower envelope (the best KL at that compute or less);
- checks the frontier claim for each baseline default: is there a setting of the family named
  by `--family` (default `rpdc`) with compute <= the baseline's and both KL figures <= the
  baseline's? The answer, and the setting that wins, go in a markdown table; where none does,
  the cheapest setting that is as faithful at more compute, and how much more.

Compute (token-layers computed / full's) is the cost axis because it is deterministic;
TTFT follows it within one run (see docs/benchmarks.md) but is noisy on a shared machine.

    python benchmarks/reuse/frontier.py /tmp/exp/*/results.json --out docs/bench/frontier
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# pic recomputes only what every strategy must (update tokens): nothing can cost less, so it
# is the quality floor, compared by KL alone (the `vs pic` column), not a frontier point
BASELINES = ("cacheblend", "epic", "cacheslide")
TIED = ("recompute_fraction_mean", "tf_kl_mean", "kl_first_token_mean")


def family(label: str) -> str:
    return label.split(":", 1)[0]


def curve(label: str) -> str:
    """The plot's series: the family, with `selection=offset` settings drawn apart from the
    probe-ranked ones (a different ranking, so a different curve)."""
    if "selection=offset" not in label:
        return family(label)
    return family(label) + (" (offset, span)" if "chunks=span" in label else " (offset)")


def groups(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(workload, case) -> strategy label -> summary, merged over the given runs."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in results:
        workloads = list(r["by_workload"])
        for case, by_strategy in r["by_case"].items():
            # each run covers one workload; its by_case summaries belong to it
            key = (workloads[0], case)
            out.setdefault(key, {}).update(by_strategy)
    return out


def dominance(
    rows: dict[str, dict[str, Any]], fam: str
) -> list[tuple[str, str | None, str | None, dict[str, Any]]]:
    """For each baseline default present: the cheapest `fam` setting that is no costlier and
    no less faithful on both KL figures (at equal cost, the one with the lowest KL), or None;
    and, when there is none, the cheapest setting that is no less faithful at any compute (how
    far above the baseline it sits)."""
    out = []
    mine = {k: v for k, v in rows.items() if family(k) == fam}
    for base in BASELINES:
        if base not in rows:
            continue
        b = rows[base]
        faithful = [
            (v["recompute_fraction_mean"], k)
            for k, v in mine.items()
            if v["tf_kl_mean"] <= b["tf_kl_mean"]
            and v["kl_first_token_mean"] <= b["kl_first_token_mean"]
        ]
        wins = [
            (c, mine[k]["tf_kl_mean"], mine[k]["kl_first_token_mean"], k)
            for c, k in faithful
            if c <= b["recompute_fraction_mean"] + 1e-9
        ]
        win = min(wins)[-1] if wins else None  # the cheapest; at equal cost, the most faithful
        near = min(faithful)[1] if faithful and win is None else None
        out.append((base, win, near, b))
    return out


def envelope(pts: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points (compute, KL, label) sorted by compute -> those no cheaper point beats on KL."""
    out: list[tuple[float, float, str]] = []
    for p in pts:
        if not out or p[1] < out[-1][1]:
            out.append(p)
    return out


def plot(grouped: dict[tuple[str, str], dict[str, dict[str, Any]]], path: Path) -> None:
    keys = sorted(grouped)
    cols = min(3, len(keys))
    rows_n = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 3.8 * rows_n), squeeze=False)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes.flat, keys, strict=False):
        rows = {k: v for k, v in grouped[key].items() if k != "full"}
        for fam in sorted({curve(k) for k in rows}):
            pts = sorted(
                (v["recompute_fraction_mean"], max(v["tf_kl_mean"], 1e-7), k)
                for k, v in rows.items()
                if curve(k) == fam
            )
            color = colors.setdefault(fam, palette[len(colors) % len(palette)])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color, label=fam)
            hull = envelope(pts)  # the family's frontier: best KL at <= compute
            ax.plot([p[0] for p in hull], [p[1] for p in hull], "-", color=color, alpha=0.8)
        ax.set_yscale("log")
        ax.set_title(f"{key[0]}, {key[1]}")
        ax.set_xlabel("recompute fraction (of full)")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("teacher-forced KL vs full\n(lower is better; 0 drawn at 1e-7)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(grouped: dict[tuple[str, str], dict[str, dict[str, Any]]], fam: str) -> str:
    lines = [
        f"| workload | case | baseline | its compute | its KL tf | cheapest `{fam}` setting "
        "at <= compute and <= both KLs | its compute | its KL tf | default's KL tf / pic's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(grouped):
        rows = grouped[key]
        floor = ""
        if fam in rows and "pic" in rows and rows["pic"]["tf_kl_mean"] > 0:
            floor = f"{rows[fam]['tf_kl_mean'] / rows['pic']['tf_kl_mean']:.2f}"
        for base, win, near, b in dominance(rows, fam):
            head = f"| {key[0]} | {key[1]} | {base} | {b['recompute_fraction_mean']:.3f} "
            head += f"| {b['tf_kl_mean']:.1e} "
            shown = win or near
            if shown is None:
                lines.append(head + f"| none at any compute | - | - | {floor} |")
                continue
            w = rows[shown]
            name = shown
            if win is not None and all(w[m] == b[m] for m in TIED):
                name = f"{shown} (tie: the same figures)"
            if win is None:
                above = w["recompute_fraction_mean"] / b["recompute_fraction_mean"] - 1
                name = f"none; at {above:+.0%} compute: {shown}"
            lines.append(
                head + f"| {name} | {w['recompute_fraction_mean']:.3f} | {w['tf_kl_mean']:.1e} "
                f"| {floor} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--family", default="rpdc")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    grouped = groups([json.loads(r.read_text()) for r in args.results])
    args.out.mkdir(parents=True, exist_ok=True)
    plot(grouped, args.out / "frontier.png")
    text = table(grouped, args.family)
    (args.out / "frontier.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
