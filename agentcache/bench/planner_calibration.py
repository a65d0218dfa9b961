"""Calibration of the plan predictor on held-out turns: for every stored measurement of a
fixed plan on a validation session, the predictor's (conservative) KL against the measured.

    covered : share of turns whose measured KL is at most the prediction (the fit's margin
              is the `quantile` of tuning residuals, so about that share is expected)
    log10   : median log10(predicted / measured): how conservative, in decades
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from agentcache.bench.planner_data import PlanRow
from agentcache.bench.report import markdown_table
from agentcache.reuse.planner.predictor import Predictor

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


def render(cal: list[dict[str, Any]]) -> str:
    head = ["family", "plan", "measure", "turns", "covered", "log10 pred/meas",
            "measured median", "predicted median"]  # fmt: skip
    return markdown_table(head, [
        [c["family"], c["plan"], c["measure"], str(c["turns"]), f"{c['covered']:.2f}",
         f"{c['log10']:.2f}", f"{c['measured_median']:.1e}", f"{c['predicted_median']:.1e}"]
        for c in cal]) + "\n"  # fmt: skip
