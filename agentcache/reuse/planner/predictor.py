"""The fidelity predictor and cost model, as one small versioned file per model.

Per plan, two log-linear fits (first-token KL and teacher-forced KL against `full`):

    log10(KL + 1e-7) = w . features(signals) + margin

    features  base  : [1, log1p(left), log1p(shift), left / T]
              where : base + [reach / T, fresh / T]      (where the left-out tokens sit)
              attn  : base + [log10(attn + 1e-4)]        (read from the model: the mass the
                                                          prompt's last tokens pay them)
              dev   : base + [log10(dev + 1e-8)]         (that mass weighted by their keys'
                                                          deviation from the stored copy)

`attn` and `dev` are studied offline (docs/bench/planner/signals.md): they did not carry to
held-out sessions, and the planner does not read them; a file naming them is refused.

`left`, `shift`, `reach`, `fresh` and `T` are the plan's `PlanSignals`; the file names its
feature set (absent: base). `margin` is a high quantile of the fit's residuals on the tuning
turns, so a prediction is an upper bound on most turns rather than a mean. A plan that leaves
no changed token out is exact: KL 0, no fit needed.

A plan's cost is not fitted: it is the plan's work over `full`'s (`PlanSignals.work`, the
cost guard's units, from the model's shapes). Format version 1 carried a cost fitted on
stored TTFTs, which inherited the timings of runs on a loaded machine and of code since
made faster, and put every plan above `full` on sessions unlike the tuning ones.

The file names the model it was fitted on and the format version; a file of another version
is refused when read, one of another model before the first prefill's model work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentcache.errors import ConfigError
from agentcache.reuse.planner.candidates import CANDIDATES, PlanSignals

FORMAT = "agentcache-plan-predictor"
VERSION = 2
EPS = 1e-7
SHIPPED = Path(__file__).parent / "data"


def base_features(s: PlanSignals) -> list[float]:
    return [1.0, math.log1p(s.left), math.log1p(s.shift), s.left / max(1, s.prompt_tokens)]


def where_features(s: PlanSignals) -> list[float]:
    t = max(1, s.prompt_tokens)
    return [*base_features(s), s.reach / t, s.fresh / t]


ATTN_FLOOR = 1e-4  # added to the attention mass before its log (a plan leaving ~nothing out)
DEV_FLOOR = 1e-8  # idem, the deviation-weighted mass (orders of magnitude smaller)


def attn_features(s: PlanSignals) -> list[float]:
    if s.attn is None:
        raise ValueError(f"plan {s.plan}: feature set attn needs the model-read signal")
    return [*base_features(s), math.log10(s.attn + ATTN_FLOOR)]


def dev_features(s: PlanSignals) -> list[float]:
    if s.dev is None:
        raise ValueError(f"plan {s.plan}: feature set dev needs the model-read signal")
    return [*base_features(s), math.log10(s.dev + DEV_FLOOR)]


FEATURES: dict[str, Callable[[PlanSignals], list[float]]] = {
    "base": base_features,
    "where": where_features,
    "attn": attn_features,
    "dev": dev_features,
}
# read from the model: fitted and judged offline (bench/reuse/planner/reads.py); the planner
# runs no such read, so a file of these sets is refused
MODEL_READ = frozenset({"attn", "dev"})
_PROBE = PlanSignals("pic", 1, 0, 0, 0, 0, 0.0, False, 1.0, attn=0.0, dev=0.0)
WIDTH = {name: len(f(_PROBE)) for name, f in FEATURES.items()}


def features(s: PlanSignals, which: str = "base") -> list[float]:
    return FEATURES[which](s)


@dataclass(frozen=True)
class KLFit:
    coef: tuple[float, ...]  # one per entry of the `features` set
    margin: float  # added in log10 space: the residual quantile of the fit
    features: str = "base"

    def predict(self, s: PlanSignals) -> float:
        if s.exact:
            return 0.0
        x = features(s, self.features)
        y = sum(w * v for w, v in zip(self.coef, x, strict=True)) + self.margin
        return max(0.0, 10.0 ** min(y, 2.0) - EPS)


@dataclass(frozen=True)
class PlanFit:
    first: KLFit
    tf: KLFit
    turns: int  # tuning turns it was fitted on


@dataclass(frozen=True)
class FloorBound:
    first: float  # bound on first-token KL
    tf: float  # bound on teacher-forced KL


@dataclass(frozen=True)
class Predictor:
    model_id: str
    plans: dict[str, PlanFit]
    floors: dict[str, FloorBound]  # "high", "balanced": KL bounds chosen on tuning turns
    quantile: float
    fitted_on: dict[str, Any] = field(default_factory=dict)  # sessions, runs, commit
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, sort_keys=True) + "\n"

    def save(self, path: Path) -> None:
        path.write_text(self.to_json())

    def check_model(self, model_id: str) -> None:
        if model_id != self.model_id:
            raise ConfigError(
                f"plan predictor was fitted on model {self.model_id!r}, not {model_id!r}: "
                "fit one for this model (benchmarks/reuse/planner/fit.py) or leave predictor unset"
            )


def load_predictor(path: Path) -> Predictor:
    """Read and check a predictor file: format, version, plans, floors."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"plan predictor {path}: cannot read it ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ConfigError(f"plan predictor {path}: not a {FORMAT} file")
    if raw.get("version") != VERSION:
        raise ConfigError(
            f"plan predictor {path}: version {raw.get('version')!r}, this agentcache reads "
            f"version {VERSION}"
        )
    try:
        return _parse(raw)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise ConfigError(f"plan predictor {path}: malformed ({e!r:.300})") from None


def _parse(raw: dict[str, Any]) -> Predictor:
    """Every number finite and in its range: a NaN bound or margin would make every
    comparison with a prediction false, and the planner's choice silently wrong."""
    plans = {}
    for name, p in _object(raw["plans"], "plans").items():
        if name not in CANDIDATES:
            raise ValueError(f"unknown plan {name!r}; known: {sorted(CANDIDATES)}")
        p = _object(p, f"plans.{name}")
        turns = p["turns"]
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
            raise ValueError(f"plans.{name}.turns must be a whole number >= 1, got {turns!r}")
        plans[name] = PlanFit(_kl(_object(p["first"], "first")), _kl(_object(p["tf"], "tf")), turns)
    floors = {
        str(k): FloorBound(_finite(v["first"], f"floors.{k}.first", 0.0),
                           _finite(v["tf"], f"floors.{k}.tf", 0.0))
        for k, v in _object(raw["floors"], "floors").items()
    }  # fmt: skip
    quantile = _finite(raw["quantile"], "quantile", 0.0)
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
    return Predictor(str(raw["model_id"]), plans, floors, quantile,
                     dict(_object(raw.get("fitted_on", {}), "fitted_on")),
                     int(raw["version"]))  # fmt: skip


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _finite(value: Any, what: str, least: float | None = None) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or (least is not None and value < least):
        floor = "" if least is None else f" >= {least:g}"
        raise ValueError(f"{what} must be a finite number{floor}, got {value!r}")
    return float(value)


def _kl(raw: dict[str, Any]) -> KLFit:
    which = str(raw.get("features", "base"))
    if which not in FEATURES:
        raise ValueError(f"unknown feature set {which!r}; known: {sorted(FEATURES)}")
    if which in MODEL_READ:
        raise ValueError(
            f"feature set {which!r} is read from the model, which the planner does not do; "
            f"it reads {sorted(set(FEATURES) - MODEL_READ)}"
        )
    coef = tuple(float(x) for x in raw["coef"])
    if len(coef) != WIDTH[which] or not all(math.isfinite(x) for x in coef):
        raise ValueError(
            f"coef must be {WIDTH[which]} finite numbers for {which}, got {raw['coef']!r:.200}"
        )
    return KLFit(coef, _finite(raw["margin"], "margin"), which)


def shipped_predictor(model_id: str) -> Predictor | None:
    """The predictor shipped for `model_id`, None when there is none."""
    for path in sorted(SHIPPED.glob("*.json")):
        p = load_predictor(path)
        if p.model_id == model_id:
            return p
    return None
