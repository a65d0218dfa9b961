"""Fitting the plan predictor on tuning turns (`PlanRow`s): per plan, log-linear KL fits
with a residual-quantile margin; the floors' KL bounds. A plan's cost is not fitted (its work
over full's, predictor.py).

    KL     log10(KL + 1e-7) ~ features(signals), least squares on the plan's rows that leave
           a changed token out; margin = the `quantile` of the residuals
    floors the largest bound on predicted KL (a grid of half-decades) under which tuning
           turns kept greedy agreement and first-token agreement at the floor's rates
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

import torch

from agentcache.bench.reuse.planner.data import PlanRow
from agentcache.reuse.planner.predictor import (
    EPS,
    FloorBound,
    KLFit,
    PlanFit,
    Predictor,
    features,
)

# floor -> (greedy exact rate, first-token agreement) the tuning turns under its bound keep
FLOOR_RATES = {"high": (0.95, 1.0), "balanced": (0.8, 0.97)}
# the targets for a strategy over a family's warm turns (the `high` floor)
TARGET_RATES = {"high": (0.9, 0.99)}
GRID = tuple(10.0 ** (e / 2) for e in range(-14, -1))  # 1e-7 .. 3e-2
MIN_ROWS = 8  # a plan with fewer informative tuning turns gets no fit (never chosen inexact)
MIN_FLOOR_TURNS = 20  # a floor's rate is judged on at least this many tuning turns


def fit_kl(rows: list[PlanRow], key: str, quantile: float, which: str = "base") -> KLFit:
    x = torch.tensor([features(r.signals, which) for r in rows], dtype=torch.float64)
    y = torch.tensor([math.log10(r.record[key] + EPS) for r in rows], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y.unsqueeze(1), driver="gelsd").solution.flatten()
    resid = y - x @ coef
    margin = float(torch.quantile(resid, quantile))
    return KLFit(tuple(float(c) for c in coef), margin, which)


def fit_floor(rows: list[PlanRow], plans: dict[str, PlanFit], greedy: float,
              first: float) -> FloorBound:  # fmt: skip
    """The largest grid bounds on the *predicted* KL under which the tuning turns' measured
    rates hold (first-token KL for the first-token rate, teacher-forced KL for greedy): the
    rule the planner applies, judged end to end on tuning turns."""
    scored = [(plans[r.plan].first.predict(r.signals), plans[r.plan].tf.predict(r.signals), r)
              for r in rows if r.plan in plans]  # fmt: skip

    def largest(which: int, rate_key: str, rate: float) -> float:
        ok = GRID[0]
        for b in GRID:
            under = [float(x[2].record[rate_key]) for x in scored if float(x[which]) <= b]  # type: ignore[arg-type]
            if len(under) < MIN_FLOOR_TURNS:
                continue  # too few tuning turns predicted this low to judge a rate by
            if statistics.fmean(under) < rate:
                break
            ok = b
        return ok

    return FloorBound(largest(0, "first_token_agreement", first),
                      largest(1, "greedy_exact_match", greedy))  # fmt: skip


def fit_predictor(
    model_id: str, rows: list[PlanRow], quantile: float, fitted_on: dict[str, Any],
    which: str = "base",
) -> Predictor:  # fmt: skip
    by_plan: dict[str, list[PlanRow]] = defaultdict(list)
    for r in rows:
        by_plan[r.plan].append(r)
    plans = {}
    for plan, rs in sorted(by_plan.items()):
        informative = [r for r in rs if not r.signals.exact]
        if len(informative) >= MIN_ROWS:
            first = fit_kl(informative, "kl_first_token", quantile, which)
            tf = fit_kl(informative, "tf_kl", quantile, which)
            plans[plan] = PlanFit(first, tf, len(informative))
    approximate = [r for r in rows if not r.signals.exact]
    floors = {name: fit_floor(approximate, plans, g, f) for name, (g, f) in FLOOR_RATES.items()}
    best = {name: best_fixed(by_plan, g, f) for name, (g, f) in TARGET_RATES.items()}
    return Predictor(model_id, plans, floors, quantile, fitted_on | {"best_fixed": best})


def best_fixed(by_plan: dict[str, list[PlanRow]], greedy: float, first: float) -> str | None:
    """The fixed plan with the lowest median TTFT / full's among those whose tuning turns kept
    the rates (the fixed strategy a user would choose on tuning data)."""
    ok = {}
    for plan, rs in by_plan.items():
        g = statistics.fmean(r.record["greedy_exact_match"] for r in rs)
        f = statistics.fmean(r.record["first_token_agreement"] for r in rs)
        if g >= greedy and f >= first:
            ok[plan] = statistics.median(r.record["ttft_ms"] / r.record["ttft_full_ms"] for r in rs)
    return min(ok, key=ok.__getitem__, default=None)
