"""Which `epic_k`: chosen on tuning runs, then read on validation runs.

On a turn `epic_over` switches (the default would rank it, and its candidates number more
than 4 per token computed anyway: reuse/upfront.py), the default computes the first `epic_k`
tokens of every moved segment instead of a probe's budget. At 64, a history of messages
shorter than that is recomputed whole: the turn keeps none of it and costs what exact prefix
reuse costs. This replays the choice of `epic_k` on runs that hold the default and the default
with each `epic_k` of the grid on the same turns.

- Tuning (the choice): per family, the warm tuning turns on which the default's record is a
  chunk-start turn (`epic_turn`). Reported per `epic_k` of the grid: greedy and first-token
  agreement with `full` on those turns, compute, and TTFT over `prefix`'s (median of per-turn
  ratios in the same run). Chosen: the smallest `epic_k` of the grid at which no family's
  greedy or first-token agreement on those turns falls below the default's (64) on the same
  turns; none such keeps 64.
- Validation (the check): the default and the chosen `epic_k` in one run per family, read
  the same way on the validation sessions' chunk-start turns.

    python benchmarks/reuse/epic_k_choice.py --out docs/bench/epic-k/choice

writes results.json and report.md.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.report import agreement, replay_args, write_replay

ROOT = Path(__file__).resolve().parents[2]
GRID = (8, 16, 32)
DEFAULT_K = 64
# the default's spec when these runs were taken; a variant is it with `:epic_k=<k>`
SPEC = (
    "rpdc:cover=1.5:cover_min=256:epic_over=4:exact_prefix=true:extra=0.2:probe_layers=10"
    ":probe_window=128:selection=attention"
)
# family -> stored runs holding `full`, `prefix`, the default and each variant per turn
K = "docs/bench/epic-k"
TUNING = {
    "chat-sysprompt": [f"{K}/tune-chat-sysprompt-a", f"{K}/tune-chat-sysprompt-b"],
    "generated": [f"{K}/tune-generated-a", f"{K}/tune-generated-b"],
}
VALIDATION = {
    "chat-sysprompt": [f"{K}/validate-chat-sysprompt-a", f"{K}/validate-chat-sysprompt-b"],
    "generated": [f"{K}/validate-generated-a", f"{K}/validate-generated-b"],
}
Row = dict[str, Any]


def label(k: int) -> str:
    """The stored label of the default with `epic_k=k` (the default itself as `rpdc`)."""
    return "rpdc" if k == DEFAULT_K else f"{SPEC}:epic_k={k}"


def turns(root: Path, paths: list[str]) -> dict[tuple[str, int], dict[str, Row]]:
    out: dict[tuple[str, int], dict[str, Row]] = {}
    for path in paths:
        for r in json.loads((root / path / "results.json").read_text())["turns"]:
            if r["turn"] > 0:
                out.setdefault((r["session"], r["turn"]), {})[r["strategy"]] = r
    return out


def summary(
    by: dict[tuple[str, int], dict[str, Row]], keys: list[tuple[str, int]], who: str
) -> Row:
    rows = [by[k][who] for k in keys]
    if not rows:
        return {"n": 0}
    ratios = [by[k][who]["ttft_ms"] / by[k]["prefix"]["ttft_ms"] for k in keys]
    return agreement(rows) | {
        "ttft_vs_prefix_median": statistics.median(ratios),
        "ttft_vs_prefix_min": min(ratios),
        "ttft_vs_prefix_max": max(ratios),
    }


def read(root: Path, runs: dict[str, list[str]], grid: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family, paths in runs.items():
        by = turns(root, paths)
        keys = [k for k, v in sorted(by.items()) if v.get("rpdc", {}).get("epic_turn")]
        missing = [k for k in keys for g in grid if label(g) not in by[k] or "prefix" not in by[k]]
        if missing:
            raise SystemExit(f"{family}: no record of every epic_k and prefix on {missing}")
        cell: dict[str, Any] = {"runs": paths, "warm_turns": sum("rpdc" in v for v in by.values()),
                                "turns": [list(k) for k in keys]}  # fmt: skip
        for g in (*grid, DEFAULT_K):
            cell[str(g)] = summary(by, keys, label(g))
        out[family] = cell
    return out


def no_loss(cell: dict[str, Any], k: int) -> bool:
    d, r = cell[str(DEFAULT_K)], cell[str(k)]
    return d["n"] == 0 or (r["greedy"] >= d["greedy"] and r["first_token"] >= d["first_token"])


def table(found: dict[str, Any], grid: tuple[int, ...]) -> list[str]:
    lines = [
        "| family | chunk-start turns | epic_k | greedy | first token | compute | TTFT / prefix |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, cell in found.items():
        for g in (DEFAULT_K, *grid):
            s = cell[str(g)]
            if s["n"] == 0:
                lines.append(f"| {family} | 0 | {g} | - | - | - | - |")
                continue
            lines.append(
                f"| {family} | {s['n']} | {g} | {s['greedy']:.2f} | {s['first_token']:.2f} "
                f"| {s['compute']:.3f} | {s['ttft_vs_prefix_median']:.2f} "
                f"({s['ttft_vs_prefix_min']:.2f}-{s['ttft_vs_prefix_max']:.2f}) |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    args = replay_args(argv, __doc__, ROOT)
    tune = read(args.root, TUNING, GRID)
    held = {str(k): all(no_loss(tune[f], k) for f in tune) for k in GRID}
    chosen = next((k for k in GRID if held[str(k)]), DEFAULT_K)
    lines = [
        "# `epic_k`: chosen on tuning runs, read on validation runs",
        "",
        "`python benchmarks/reuse/epic_k_choice.py --out docs/bench/epic-k/choice`",
        "",
        f"The default (`{SPEC}`, `epic_k` {DEFAULT_K}) and the same spec with each `epic_k` of "
        "the grid, in one run per half of each family, on the warm turns where the default "
        "computes chunk starts (`epic_turn`). Greedy: share whose 32-token continuation "
        "equals `full`'s; compute: token-layers over `full`'s (mean); TTFT / prefix: median "
        "over those turns of the per-turn ratio (min-max).",
        "",
        "Tuning:",
        "",
        *table(tune, GRID),
        "",
        "No family loses agreement on those turns at epic_k = "
        + ", ".join(f"{k}: {'yes' if held[str(k)] else 'no'}" for k in GRID)
        + f". Chosen (the smallest such epic_k, else {DEFAULT_K}): **{chosen}**.",
    ]
    val: dict[str, Any] = {}
    if chosen != DEFAULT_K and all(
        (args.root / p / "results.json").exists() for ps in VALIDATION.values() for p in ps
    ):
        val = read(args.root, VALIDATION, (chosen,))
        lines += ["", f"Validation (`epic_k={chosen}` against the default, one run per half):",
                  "", *table(val, (chosen,))]  # fmt: skip
    settings = {"default_k": DEFAULT_K, "spec": SPEC}
    write_replay(args.out, lines, GRID, settings, held, chosen, tune, val)


if __name__ == "__main__":
    main()
