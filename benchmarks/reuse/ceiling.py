"""How much faster than prefix caching any reuse can make a turn: the perfect-cache ceiling.

Every `agentcache bench` record carries `ttft_limit_ms`, the TTFT of a perfect cache (only the
update tokens and the last token computed, every other token's KV resident and exact), measured
in the same run as the strategies. For every warm turn with a `prefix` record this script
divides `prefix`'s TTFT by that limit: no reuse strategy, in any engine, can beat prefix
caching by more on that turn, because it still has to compute the update tokens. The same
ratio in tokens (tokens prefix caching computes / tokens the perfect cache computes) does not
depend on the engine's speed.

Output, per workload and case: the median ceiling in TTFT and in tokens, the share of turns
whose ceiling reaches `--target` (default 2), and, where the run has it, the measured
speedup of `--strategy` (default `rpdc`) over `prefix`; a markdown table and a strip plot.

    python benchmarks/reuse/ceiling.py docs/bench/{reflexion,memgpt,swe_agent}/results.json \
        --out docs/bench/ceiling
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@dataclass(frozen=True)
class TurnCeiling:
    workload: str
    case: str
    session: str
    turn: int
    ttft: float  # prefix TTFT / perfect-cache TTFT
    tokens: float  # tokens prefix caching computes / tokens the perfect cache computes
    measured: float | None  # prefix TTFT / the strategy's TTFT, where the run has it


def ceilings(results: list[dict[str, Any]], strategy: str = "rpdc") -> list[TurnCeiling]:
    """One entry per warm turn that has a `prefix` record (turn 0 has nothing to reuse)."""
    out = []
    for r in results:
        by_turn: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        for t in r["turns"]:
            by_turn.setdefault((t["session"], t["turn"]), {})[t["strategy"]] = t
        for (session, turn), recs in sorted(by_turn.items()):
            p = recs.get("prefix")
            if turn == 0 or p is None:
                continue
            limit_tokens = _limit_tokens(recs)
            s = recs.get(strategy)
            out.append(TurnCeiling(
                p["workload"], p["case"], session, turn,
                p["ttft_ms"] / p["ttft_limit_ms"],
                (p["prompt_tokens"] - p["reused_tokens"]) / limit_tokens,
                p["ttft_ms"] / s["ttft_ms"] if s is not None else None,
            ))  # fmt: skip
    return out


def _limit_tokens(recs: dict[str, dict[str, Any]]) -> int:
    """Tokens the perfect cache computes: `pic` computes exactly those (no selection)."""
    pic = recs.get("pic")
    if pic is None:
        raise ValueError("the run has no `pic` records: rerun with `--strategies ...,pic`")
    return int(pic["recomputed_tokens"])


def table(turns: list[TurnCeiling], target: float, strategy: str) -> str:
    lines = [
        f"| workload | case | warm turns | ceiling over prefix, TTFT (median) | in tokens "
        f"(median) | turns with ceiling >= {target:g}x | `{strategy}` over prefix (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[TurnCeiling]] = {}
    for t in turns:
        groups.setdefault((t.workload, t.case), []).append(t)
    for (w, case), ts in sorted(groups.items()):
        measured = [t.measured for t in ts if t.measured is not None]
        reach = sum(t.ttft >= target for t in ts)
        lines.append(
            f"| {w} | {case} | {len(ts)} | {statistics.median(t.ttft for t in ts):.2f}x "
            f"| {statistics.median(t.tokens for t in ts):.2f}x | {reach} of {len(ts)} "
            f"| {f'{statistics.median(measured):.2f}x' if measured else '-'} |"
        )
    return "\n".join(lines) + "\n"


def plot(turns: list[TurnCeiling], target: float, strategy: str, path: Path) -> None:
    labels = sorted({(t.workload, t.case) for t in turns})
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for i, key in enumerate(labels):
        ts = [t for t in turns if (t.workload, t.case) == key]
        ax.scatter([i - 0.1] * len(ts), [t.ttft for t in ts], color="tab:blue", s=18,
                   label="perfect cache" if i == 0 else None)  # fmt: skip
        got = [t.measured for t in ts if t.measured is not None]
        ax.scatter([i + 0.1] * len(got), got, color="tab:orange", marker="x", s=18,
                   label=strategy if i == 0 else None)  # fmt: skip
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"{target:g}x")
    ax.set_xticks(range(len(labels)), [f"{w}\n{c}" for w, c in labels])
    ax.set_ylabel("TTFT speedup over prefix caching")
    ax.set_title("Per warm turn: the most any reuse can gain over prefix caching")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="results.json of `agentcache bench`")
    ap.add_argument("--strategy", default="rpdc", help="strategy whose measured speedup to show")
    ap.add_argument("--target", type=float, default=2.0, help="speedup over prefix to check")
    ap.add_argument("--out", type=Path, required=True, help="folder for ceiling.md/.png")
    args = ap.parse_args()
    turns = ceilings([json.loads(p.read_text()) for p in args.results], args.strategy)
    if not turns:
        raise SystemExit("no warm turns with a `prefix` record in these results")
    args.out.mkdir(parents=True, exist_ok=True)
    md = table(turns, args.target, args.strategy)
    (args.out / "ceiling.md").write_text(md)
    plot(turns, args.target, args.strategy, args.out / "ceiling.png")
    print(md, end="")


if __name__ == "__main__":
    main()
