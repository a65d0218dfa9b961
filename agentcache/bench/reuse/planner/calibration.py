"""Calibration of the plan predictor on held-out turns: for every stored measurement of a
fixed plan on a validation session, the predictor's (conservative) KL against the measured.

    covered : share of turns whose measured KL is at most the prediction (the fit's margin
              is the `quantile` of tuning residuals, so about that share is expected)
    log10   : median log10(predicted / measured): how conservative, in decades

and the cost the planner reads (a plan's work over full's, not fitted) against the measured
TTFT over full's.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from agentcache.bench.reuse.planner.data import PlanRow
from agentcache.bench.reuse.report import markdown_table
from agentcache.bench.stats import spread
from agentcache.reuse.planner.candidates import PlanSignals
from agentcache.reuse.planner.choice import Floor, choose
from agentcache.reuse.planner.predictor import Predictor
from agentcache.reuse.planner.strategy import estimate

MEASURES = (("kl_first_token", "first"), ("tf_kl", "tf"))


def calibrate(p: Predictor, rows: list[PlanRow]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[PlanRow]] = defaultdict(list)
    for r in rows:
        if r.plan in p.plans and not r.signals.exact:
            groups[(r.family, r.plan)].append(r)
    out = []
    for (family, plan), rs in sorted(groups.items()):
        fit = p.plans[plan]
        for key, which in MEASURES:
            kl = fit.first if which == "first" else fit.tf
            pairs = [(kl.predict(r.signals), r.record[key]) for r in rs]
            out.append({
                "family": family, "plan": plan, "measure": key, "turns": len(pairs),
                "covered": statistics.fmean(m <= q for q, m in pairs),
                "log10": statistics.median(math.log10((q + 1e-9) / (m + 1e-9)) for q, m in pairs),
                "measured_median": statistics.median(m for _, m in pairs),
                "predicted_median": statistics.median(q for q, _ in pairs),
            })  # fmt: skip
    return out


def cost_calibration(rows: list[PlanRow]) -> list[dict[str, Any]]:
    """Per family and plan: the planner's cost (the plan's work over full's) against the
    measured TTFT over full's on the same turns."""
    groups: dict[tuple[str, str], list[PlanRow]] = defaultdict(list)
    for r in rows:
        groups[(r.family, r.plan)].append(r)
    out = []
    for (family, plan), rs in sorted(groups.items()):
        pairs = [(r.signals.work, r.record["ttft_ms"] / r.record["ttft_full_ms"]) for r in rs]
        excess = spread([m - w for w, m in pairs])
        out.append({
            "family": family, "plan": plan, "turns": len(pairs),
            "work_median": statistics.median(w for w, _ in pairs),
            "measured_median": statistics.median(m for _, m in pairs),
            "excess_median": excess["median"], "excess_q25": excess["q25"],
            "excess_q75": excess["q75"],
        })  # fmt: skip
    return out


def render_cost(cal: list[dict[str, Any]]) -> str:
    head = ["family", "plan", "turns", "work / full's (median)", "TTFT / full's (median)",
            "TTFT/full - work, median (IQR)"]  # fmt: skip
    return markdown_table(head, [
        [c["family"], c["plan"], str(c["turns"]), f"{c['work_median']:.3f}",
         f"{c['measured_median']:.3f}",
         f"{c['excess_median']:+.3f} ({c['excess_q25']:+.3f} to {c['excess_q75']:+.3f})"]
        for c in cal]) + "\n"  # fmt: skip


def render(cal: list[dict[str, Any]]) -> str:
    head = ["family", "plan", "measure", "turns", "covered", "log10 pred/meas",
            "measured median", "predicted median"]  # fmt: skip
    return markdown_table(head, [
        [c["family"], c["plan"], c["measure"], str(c["turns"]), f"{c['covered']:.2f}",
         f"{c['log10']:.2f}", f"{c['measured_median']:.1e}", f"{c['predicted_median']:.1e}"]
        for c in cal]) + "\n"  # fmt: skip


def replay_choices(
    p: Predictor, rows: list[PlanRow], floor: Floor, min_gain: float
) -> list[dict[str, Any]]:
    """The planner's choice on each stored turn, judged by the stored record of the plan it
    chose (a replay: the turn's TTFT is that run's, planning time not included). A turn whose
    choice has no record in the run (`exact`, which no stored run measured) takes prefix's
    record, exact like it; such turns are counted."""
    turns: dict[tuple[str, str, int], dict[str, PlanRow]] = defaultdict(dict)
    for r in rows:
        turns[(r.family, r.session, r.turn)][r.plan] = r
    by_family: dict[str, list[tuple[str, dict[str, Any], bool]]] = defaultdict(list)
    for (family, _, _), plans in sorted(turns.items()):
        estimates = [estimate(r.signals, p) for r in plans.values()]
        exact = _exact_signals(plans)
        if exact is not None:
            estimates.append(estimate(exact, p))
        chosen = choose(estimates, floor, min_gain)
        stand_in = chosen.plan not in plans
        row = plans["prefix" if stand_in else chosen.plan]
        by_family[family].append((chosen.plan, row.record, stand_in))
    out = []
    for family, picks in sorted(by_family.items()):
        recs = [rec for _, rec, _ in picks]
        out.append({
            "family": family, "turns": len(picks),
            "plans": dict(Counter(plan for plan, _, _ in picks).most_common()),
            "stand_ins": sum(s for _, _, s in picks),
            "greedy": statistics.fmean(r["greedy_exact_match"] for r in recs),
            "first": statistics.fmean(r["first_token_agreement"] for r in recs),
            "vs_full": statistics.median(r["ttft_ms"] / r["ttft_full_ms"] for r in recs),
        })  # fmt: skip
    return out


def _exact_signals(plans: dict[str, PlanRow]) -> PlanSignals | None:
    """The `exact` plan's signals on a turn, replayed with the others (None when not)."""
    return next((r.on_turn["exact"] for r in plans.values() if "exact" in r.on_turn), None)
