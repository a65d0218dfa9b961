"""Which `epic_over` ratio: replayed on stored tuning records, then read on validation runs.

`epic_over=r` (reuse/upfront.py): a turn the default would rank, whose candidates number more
than r per token computed anyway, computes EPIC's chunk starts (the first 64 tokens of every
moved segment) instead of the probe's budget of 0.2 per computed token. The default ranks a
turn when its candidates number more than max(1.5 x computed, 256) (`cover`, `cover_min`); on
every other turn the option does nothing.

- Tuning (the choice): per family, every warm tuning turn with a record of the default (`rpdc`)
  and of `epic` in the same run. A turn the rule switches at r is judged by `epic`'s record
  (`epic:boundary_k=64`, which also recomputes the openings of segments whose context did not
  change: a superset of the option's tokens), the others by the default's. Reported per r of
  the grid: turns switched, the default's and the rule's greedy and first-token agreement on
  them, and their TTFT over `prefix`'s in the same run. Chosen: the smallest r of the grid at
  which no family's greedy or first-token agreement on its switched turns falls below the
  default's on the same turns (the smallest acts on the most turns).
- Validation (the check): runs of the default and `rpdc:epic_over=<r>` in one run per family,
  read as within-run per-turn ratios.

    python benchmarks/reuse/epic_over_choice.py --out docs/bench/epic-over/choice

writes results.json and report.md.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from agentcache.bench.reuse.report import agreement, covered_at, replay_args, write_replay

ROOT = Path(__file__).resolve().parents[2]
GRID = (2.0, 4.0, 8.0)
COVER, COVER_MIN = 1.5, 256  # the default's
# family -> stored tuning run holding the default (`rpdc`), `epic` and `prefix` per turn
TUNING = {
    "chat-sysprompt": "docs/bench/epic-over/tune-chat-sysprompt",
    "memgpt": "docs/bench/tuned/tune-memgpt",
    "memgpt (-00, -01)": "docs/bench/epic-over/tune-memgpt",
    "reflexion": "docs/bench/tuned/tune-reflexion",
    "swe_agent": "docs/bench/tuned/tune-swe_agent",
    "chat": "docs/bench/tuned/tune-chat",
    "generated": "docs/bench/generated/tune",
    "chat-edit (its missed turns)": "docs/bench/planner/min-ratio/tune-misses",
}
VALIDATION = {
    "chat-sysprompt": "docs/bench/epic-over/validate-chat-sysprompt",
    "generated (-20 to -23)": "docs/bench/epic-over/validate-generated-b",
}
Row = dict[str, Any]


def turns(path: Path) -> dict[tuple[str, int], dict[str, Row]]:
    data = json.loads((path / "results.json").read_text())
    out: dict[tuple[str, int], dict[str, Row]] = {}
    for r in data["turns"]:
        if r["turn"] > 0:  # the previous default, as stored ("rpdc") or named again
            label = "rpdc" if r["strategy"] == "rpdc:epic_over=0" else r["strategy"]
            out.setdefault((r["session"], r["turn"]), {})[label] = r
    return out


def ranked(r: Row) -> bool:
    """The default ranks this turn (neither cover nor its floor makes it exact)."""
    return not covered_at(r, COVER) and r["candidates"] > COVER_MIN


def switched(r: Row, over: float) -> bool:
    return ranked(r) and r["candidates"] > over * r["computed_anyway"]


def tuning(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for family, path in TUNING.items():
        by = turns(root / path)
        out[family] = {"run": path, "warm_turns": sum("rpdc" in v for v in by.values())}
        for over in GRID:
            keys = [k for k, v in sorted(by.items()) if "rpdc" in v and switched(v["rpdc"], over)]
            missing = [k for k in keys if "epic" not in by[k]]
            if missing:
                raise SystemExit(f"{family}: no epic record of tuning turns {missing}")
            default = [by[k]["rpdc"] for k in keys]
            epic = [by[k]["epic"] for k in keys]
            cell: dict[str, Any] = {
                "turns": [list(k) for k in keys],
                "default": agreement(default),
                "rule": agreement(epic),
            }
            if keys and all("prefix" in by[k] for k in keys):
                for who, label in (("rule", "epic"), ("default", "rpdc")):
                    cell[who]["ttft_vs_prefix_median"] = statistics.median(
                        by[k][label]["ttft_ms"] / by[k]["prefix"]["ttft_ms"] for k in keys
                    )
            out[family][f"{over:g}"] = cell
    return out


def no_loss(cell: dict[str, Any]) -> bool:
    d, r = cell["default"], cell["rule"]
    return d["n"] == 0 or (r["greedy"] >= d["greedy"] and r["first_token"] >= d["first_token"])


def validation(root: Path, over: float) -> dict[str, Any]:
    label = f"rpdc:epic_over={over:g}"
    out: dict[str, Any] = {}
    for family, path in VALIDATION.items():
        if not (root / path / "results.json").exists():
            continue
        by = turns(root / path)
        keys = [k for k, v in sorted(by.items()) if "rpdc" in v and label in v]
        cells: dict[str, Any] = {"run": path, "label": label}
        for who in ("rpdc", label):
            rows = [by[k][who] for k in keys]
            ratios = [by[k][who]["ttft_ms"] / by[k]["prefix"]["ttft_ms"] for k in keys]
            cells[who] = agreement(rows) | {
                "ttft_vs_prefix_median": statistics.median(ratios),
                "ttft_vs_prefix_min": min(ratios), "ttft_vs_prefix_max": max(ratios),
                "epic_turns": sum(bool(r.get("epic_turn")) for r in rows),
            }  # fmt: skip
        out[family] = cells
    return out


def main(argv: list[str] | None = None) -> None:
    args = replay_args(argv, __doc__, ROOT)
    tune = tuning(args.root)
    held = {f"{o:g}": all(no_loss(tune[f][f"{o:g}"]) for f in TUNING) for o in GRID}
    chosen = next((o for o in GRID if held[f"{o:g}"]), None)
    lines = [
        "# `epic_over`: chosen on tuning records, read on validation runs",
        "",
        "`python benchmarks/reuse/epic_over_choice.py --out docs/bench/epic-over/choice`",
        "",
        "Tuning: on the warm turns the rule switches at each ratio (the default ranks them and "
        "their candidates number more than r per computed token), the default's record against"
        " `epic`'s on the same turns of one run. Greedy: share whose 32-token continuation "
        "equals `full`'s; TTFT / prefix: median over those turns of the per-turn ratio.",
        "",
        "| family | warm turns | r | switched | default greedy | rule greedy | default first "
        "| rule first | default TTFT / prefix | rule TTFT / prefix |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ttft(c: dict[str, Any]) -> str:
        return f"{c['ttft_vs_prefix_median']:.2f}" if "ttft_vs_prefix_median" in c else "-"

    for family in TUNING:
        for over in GRID:
            c = tune[family][f"{over:g}"]
            d, r = c["default"], c["rule"]
            if d["n"] == 0:
                lines.append(f"| {family} | {tune[family]['warm_turns']} | {over:g} | 0 "
                             "| - | - | - | - | - | - |")  # fmt: skip
                continue
            lines.append(
                f"| {family} | {tune[family]['warm_turns']} | {over:g} | {d['n']} "
                f"| {d['greedy']:.2f} | {r['greedy']:.2f} | {d['first_token']:.2f} "
                f"| {r['first_token']:.2f} | {ttft(d)} | {ttft(r)} |"
            )
    lines += [
        "",
        "No family loses agreement on its switched turns at r = "
        + ", ".join(f"{o:g}: {'yes' if held[f'{o:g}'] else 'no'}" for o in GRID)
        + f". Chosen (the smallest such r): **{'none' if chosen is None else f'{chosen:g}'}**.",
    ]
    val = validation(args.root, chosen) if chosen is not None else {}
    if val:
        lines += [
            "",
            f"Validation (`rpdc:epic_over={chosen:g}` against the default in one run per "
            "family; TTFT / prefix: median of per-turn ratios, min-max):",
            "",
            "| family | strategy | n | greedy | first token | compute | TTFT / prefix "
            "| chunk-start turns |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for family, cells in val.items():
            for who in ("rpdc", cells["label"]):
                s = cells[who]
                lines.append(
                    f"| {family} | `{who}` | {s['n']} | {s['greedy']:.2f} "
                    f"| {s['first_token']:.2f} | {s['compute']:.3f} "
                    f"| {s['ttft_vs_prefix_median']:.2f} ({s['ttft_vs_prefix_min']:.2f}-"
                    f"{s['ttft_vs_prefix_max']:.2f}) | {s['epic_turns']} |"
                )
    settings = {"cover": COVER, "cover_min": COVER_MIN}
    write_replay(args.out, lines, GRID, settings, held, chosen, tune, val)


if __name__ == "__main__":
    main()
