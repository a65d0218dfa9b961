"""The planner's report on a bench run: per family, the planner against the best fixed
strategy at the floor chosen afterwards (an oracle bound: it saw the results) and against
the best fixed strategy chosen on tuning data; which plans it took and why; its calibration.

A strategy meets the floor on a family when its warm turns' greedy continuation equals
full's on >= `greedy` of them and the first token on >= `first` (the `high` floor's rates).
TTFT ratios are medians over warm turns of per-turn ratios within the run.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from agentcache.bench.reuse.report import markdown_table, warm

PLANNER = "plan"


@dataclass(frozen=True)
class Rates:
    greedy: float = 0.9
    first: float = 0.99


def by_turn(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    out: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in warm(records):
        out[(r["session"], r["turn"])][r["strategy"]] = r
    return out


def per_turn(turns: list[dict[str, dict[str, Any]]], label: str, over: str) -> list[float]:
    """`label`'s TTFT over `over`'s, per turn that measured both."""
    return [t[label]["ttft_ms"] / t[over]["ttft_ms"] for t in turns if label in t and over in t]


def ratio(turns: list[dict[str, dict[str, Any]]], label: str, over: str) -> float:
    """The median of the per-turn ratios (nan when no turn measured both)."""
    xs = per_turn(turns, label, over)
    return statistics.median(xs) if xs else math.nan


def rates(turns: list[dict[str, dict[str, Any]]], label: str) -> tuple[float, float, float, int]:
    rs = [t[label] for t in turns if label in t]
    if not rs:
        return math.nan, math.nan, math.nan, 0
    g = statistics.fmean(r["greedy_exact_match"] for r in rs)
    f = statistics.fmean(r["first_token_agreement"] for r in rs)
    kl = statistics.fmean(r["tf_kl"] for r in rs)
    return g, f, kl, len(rs)


def meets(turns: list[dict[str, dict[str, Any]]], label: str, floor: Rates) -> bool:
    g, f, _, n = rates(turns, label)
    return n > 0 and g >= floor.greedy and f >= floor.first


# not fixed strategies a user would pick: the planner is what is compared, `full` the
# reference, the `transformers` peer no agentcache setting
NOT_FIXED = frozenset({PLANNER, "full", "transformers-prefix"})


def fastest_at_floor(turns: list[dict[str, dict[str, Any]]], floor: Rates) -> str | None:
    """The fixed strategy with the lowest median per-turn TTFT / full's among those whose
    turns meet `floor` (None when none does)."""
    labels = sorted({s for t in turns for s in t} - NOT_FIXED)
    fixed = [s for s in labels if meets(turns, s, floor)]
    return min(fixed, key=lambda s: ratio(turns, s, "full"), default=None)


def family_rows(
    records: list[dict[str, Any]], tuned: str | None, floor: Rates
) -> list[dict[str, Any]]:
    """One row per family: planner, oracle, tuning-chosen fixed strategy."""
    fams: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        fams[r["workload"]].append(r)
    rows = []
    for fam, recs in sorted(fams.items()):
        turns = list(by_turn(recs).values())
        oracle = fastest_at_floor(turns, floor)
        row: dict[str, Any] = {"family": fam, "turns": len(turns), "oracle": oracle,
                               "tuned": tuned}  # fmt: skip
        for who, label in (("plan", PLANNER), ("oracle", oracle), ("tuned", tuned)):
            if label is None or not any(label in t for t in turns):
                continue
            g, f, kl, n = rates(turns, label)
            row[who] = {
                "label": label, "n": n, "greedy": g, "first": f, "tf_kl": kl,
                "meets": meets(turns, label, floor),
                "vs_full": ratio(turns, label, "full"), "vs_prefix": ratio(turns, label, "prefix"),
            }  # fmt: skip
        if "oracle" in row and "plan" in row:
            row["plan_vs_oracle"] = ratio(turns, PLANNER, row["oracle"]["label"])
        if any("prefix" in t for t in turns) and "plan" in row:
            row["plan_worst_vs_prefix"] = max(per_turn(turns, PLANNER, "prefix"), default=math.nan)
        rows.append(row)
    return rows


def plan_choices(records: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    """Per family, how often each plan was chosen on warm turns (fallbacks as `plan*`)."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for r in warm(records):
        if r["strategy"] == PLANNER and "plan" in r:
            out[r["workload"]][r["plan"] + ("*" if r.get("plan_unpredicted") else "")] += 1
    return out


def calibration(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family, the planner's approximate turns: predicted against measured KL (the share
    of turns whose measured KL is at most the prediction, and the median log10 ratio)."""
    fams: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in warm(records):
        if r["strategy"] == PLANNER and "plan" in r and not r["plan_exact"]:
            fams[r["workload"]].append(r)
    out = []
    for fam, rs in sorted(fams.items()):
        for key, pred in (("kl_first_token", "predicted_kl_first_token"),
                          ("tf_kl", "predicted_tf_kl")):  # fmt: skip
            covered = statistics.fmean(r[key] <= r[pred] for r in rs)
            logs = [math.log10((r[pred] + 1e-9) / (r[key] + 1e-9)) for r in rs]
            out.append({"family": fam, "measure": key, "turns": len(rs), "covered": covered,
                        "log10_pred_over_measured": statistics.median(logs)})  # fmt: skip
    return out


def render(records: list[dict[str, Any]], tuned: str | None, floor: Rates) -> str:
    rows = family_rows(records, tuned, floor)
    lines = [
        f"Floor: greedy equal to full's on >= {floor.greedy:g} of warm turns, first token "
        f">= {floor.first:g}. TTFT ratios: median over warm turns of per-turn ratios.",
        "",
    ]
    head = ["family", "who", "strategy", "n", "TTFT/full", "TTFT/prefix", "greedy", "first tok",
            "KL tf", "meets floor"]  # fmt: skip
    body = []
    for row in rows:
        for who in ("plan", "oracle", "tuned"):
            c = row.get(who)
            if c is None:
                continue
            body.append([row["family"], who, c["label"], str(c["n"]), f"{c['vs_full']:.3f}",
                         f"{c['vs_prefix']:.3f}", f"{c['greedy']:.2f}", f"{c['first']:.2f}",
                         f"{c['tf_kl']:.2e}", "yes" if c["meets"] else "no"])  # fmt: skip
    lines.append(markdown_table(head, body))
    lines += ["", "Planner TTFT over the oracle's (median of per-turn ratios) and its worst turn "
              "over prefix's:", ""]  # fmt: skip
    lines.append(markdown_table(["family", "plan/oracle", "worst plan/prefix"], [
        [r["family"], f"{r.get('plan_vs_oracle', math.nan):.3f}",
         f"{r.get('plan_worst_vs_prefix', math.nan):.3f}"] for r in rows]))  # fmt: skip
    lines += ["", "Plans chosen on warm turns (`*`: the predictor could not run; exact):", ""]
    lines.append(markdown_table(["family", "plans"], [
        [f, ", ".join(f"{p} {n}" for p, n in c.most_common())]
        for f, c in sorted(plan_choices(records).items())]))  # fmt: skip
    cal = calibration(records)
    lines += ["", "Calibration on the planner's approximate turns (covered: measured KL <= "
              "predicted):", ""]  # fmt: skip
    lines.append(markdown_table(["family", "measure", "turns", "covered", "log10 pred/measured"], [
        [c["family"], c["measure"], str(c["turns"]), f"{c['covered']:.2f}",
         f"{c['log10_pred_over_measured']:.2f}"] for c in cal]) if cal else "(none)")  # fmt: skip
    return "\n".join(lines) + "\n"
