"""Does a predictor signal carry to sessions the fit never saw? Cross-validation on tuning
turns alone, per feature set (predictor.FEATURES), and why `plan` chose what it chose on a
family's turns.

    held out   family  : fit on the other families' tuning turns, judge the held-out family's
               session : fit on even-numbered tuning sessions, judge the odd ones, and back
    judged     the `high` floor's choices replayed on the held-out turns (planner_calibration
               .replay_choices: each choice takes the stored record of the chosen plan), and
               the share of held-out plan-turns whose measured KL the prediction covers

Only turns with a stored `prefix` record are replayed (an `exact` choice takes prefix's
record as its stand-in); the others still count in the coverage.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentcache.bench.reuse.planner.calibration import MEASURES, calibrate, replay_choices
from agentcache.bench.reuse.planner.data import PlanRow
from agentcache.bench.reuse.planner.fit import MIN_ROWS, fit_kl, fit_predictor
from agentcache.bench.reuse.report import markdown_table
from agentcache.reuse.planner.choice import Floor
from agentcache.reuse.planner.predictor import EPS, KLFit, Predictor, features
from agentcache.reuse.planner.strategy import estimate


@dataclass(frozen=True)
class Held:
    features: str
    split: str  # "family" or "session"
    family: str
    turns: int  # replayed warm turns
    greedy: float
    first: float
    vs_full: float  # median TTFT / full's of the replayed choices
    covered: float  # lowest coverage over the family's plans and both KLs
    plans: dict[str, int]
    conservative: float  # median over plans and KLs of median log10(predicted / measured)


def _session_parity(r: PlanRow) -> int:
    return int(r.session.rsplit("-", 1)[1]) % 2


def cross_validate(rows: list[PlanRow], which: str, split: str, quantile: float) -> list[Held]:
    """Per held-out family (pooled over both folds for `session`), the replayed choices."""
    folds: list[tuple[Callable[[PlanRow], bool], str | None]]
    families = sorted({r.family for r in rows})
    if split == "family":
        folds = [((lambda r, f=f: r.family == f), f) for f in families]  # type: ignore[misc]
    elif split == "session":
        folds = [((lambda r, k=k: _session_parity(r) == k), None) for k in (0, 1)]  # type: ignore[misc]
    else:
        raise ValueError(f"split must be family or session, got {split!r}")
    picks: dict[str, list[dict[str, Any]]] = {f: [] for f in families}
    cover: dict[str, list[float]] = {f: [] for f in families}
    decades: dict[str, list[float]] = {f: [] for f in families}
    for held, _ in folds:
        p = fit_predictor("cv", [r for r in rows if not held(r)], quantile, {}, which)
        test = [r for r in rows if held(r)]
        for c in calibrate(p, test):
            cover[c["family"]].append(c["covered"])
            decades[c["family"]].append(c["log10"])
        b = p.floors["high"]
        picks_of = {(r.session, r.turn) for r in test if r.plan == "prefix"}
        replayable = [r for r in test if (r.session, r.turn) in picks_of]
        for c in replay_choices(p, replayable, Floor("high", b.first, b.tf), 0.02):
            picks[c["family"]].append(c)
    out = []
    for f in families:
        cs = picks[f]
        if not cs:
            continue
        n = sum(c["turns"] for c in cs)
        plans: dict[str, int] = {}
        for c in cs:
            for k, v in c["plans"].items():
                plans[k] = plans.get(k, 0) + v
        out.append(Held(
            which, split, f, n,
            sum(c["turns"] * c["greedy"] for c in cs) / n,
            sum(c["turns"] * c["first"] for c in cs) / n,
            statistics.median(c["vs_full"] for c in cs),
            min(cover[f], default=float("nan")), plans,
            statistics.median(decades[f]) if decades[f] else float("nan"),
        ))  # fmt: skip
    return out


def render_cv(held: list[Held]) -> str:
    head = ["features", "held out", "family", "turns", "greedy", "first tok", "TTFT/full",
            "coverage (lowest)", "log10 pred/meas", "plans chosen"]  # fmt: skip
    return markdown_table(head, [
        [h.features, h.split, h.family, str(h.turns), f"{h.greedy:.2f}", f"{h.first:.2f}",
         f"{h.vs_full:.3f}", f"{h.covered:.2f}", f"{h.conservative:.2f}",
         ", ".join(f"{k} {v}" for k, v in sorted(h.plans.items(), key=lambda kv: -kv[1]))]
        for h in held]) + "\n"  # fmt: skip


def residuals(rows: list[PlanRow], which: str, label: str) -> list[dict[str, Any]]:
    """In sample, per measure: each plan's KL fit on every tuning turn (all families pooled);
    the residuals' spread and their mean per family (what the features leave unexplained
    between families), medians over the plans fitted (log10)."""
    by_plan: dict[str, list[PlanRow]] = {}
    for r in rows:
        if not r.signals.exact:
            by_plan.setdefault(r.plan, []).append(r)
    out = []
    for key, _ in MEASURES:
        sd, bias = [], defaultdict(list)
        for rs in by_plan.values():
            if len(rs) < MIN_ROWS:
                continue
            fit = fit_kl(rs, key, 0.5, which)
            res = [math.log10(r.record[key] + EPS) - _mean(fit, r) for r in rs]
            sd.append(statistics.pstdev(res))
            fam: dict[str, list[float]] = defaultdict(list)
            for r, e in zip(rs, res, strict=True):
                fam[r.family].append(e)
            for f, es in fam.items():
                bias[f].append(statistics.fmean(es))
        out.append(
            {
                "features": label,
                "measure": key,
                "sd": statistics.median(sd),
                "bias": {f: statistics.median(b) for f, b in sorted(bias.items())},
            }
        )
    return out


def _mean(fit: KLFit, r: PlanRow) -> float:
    return sum(w * v for w, v in zip(fit.coef, features(r.signals, fit.features), strict=True))


def render_residuals(res: list[dict[str, Any]]) -> str:
    families = sorted({f for r in res for f in r["bias"]})
    head = ["features", "measure", "residual sd", *[f"mean residual {f}" for f in families]]
    body = [[r["features"], r["measure"], f"{r['sd']:.2f}",
             *[f"{r['bias'].get(f, float('nan')):+.2f}" for f in families]]
            for r in res]  # fmt: skip
    return markdown_table(head, body) + "\n"


def why_table(p: Predictor, rows: list[PlanRow], family: str, floor: Floor) -> str:
    """Per warm turn of `family`: what each approximate plan was predicted and measured
    (first-token KL), its TTFT/full, and the floor's bound: why the exact plans won."""
    turns: dict[tuple[str, int], dict[str, PlanRow]] = {}
    for r in rows:
        if r.family == family:
            turns.setdefault((r.session, r.turn), {})[r.plan] = r
    head = ["session", "turn", "plan", "left / T", "first KL pred", "first KL meas",
            "greedy", "TTFT/full", "meets bound"]  # fmt: skip
    body = []
    for (session, turn), plans in sorted(turns.items()):
        for name, r in sorted(plans.items()):
            e = estimate(r.signals, p)
            s, rec = r.signals, r.record
            body.append([session, str(turn), name, f"{s.left}/{s.prompt_tokens}",
                         f"{e.first_kl:.1e}", f"{rec['kl_first_token']:.1e}",
                         f"{rec['greedy_exact_match']:.0f}",
                         f"{rec['ttft_ms'] / rec['ttft_full_ms']:.2f}",
                         "yes" if e.meets(floor) else "no"])  # fmt: skip
    return markdown_table(head, body) + "\n"
