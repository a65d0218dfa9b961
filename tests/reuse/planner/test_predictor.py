"""The predictor file: round trip, and the errors a wrong file gives before model work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agentcache.errors import ConfigError
from agentcache.reuse.planner.candidates import PlanSignals
from agentcache.reuse.planner.predictor import (
    SHIPPED,
    KLFit,
    Predictor,
    load_predictor,
    shipped_predictor,
)
from agentcache.reuse.spec import StrategySpec
from tests.reuse.planner.conftest import predictor_for


def test_round_trip(tmp_path: Path, tiny_predictor: Predictor) -> None:
    path = tmp_path / "p.json"
    tiny_predictor.save(path)
    assert load_predictor(path) == tiny_predictor


def test_prediction_is_monotone_in_the_margin_and_zero_when_exact() -> None:
    p = predictor_for("m", kl_log10=-4.0)
    s = PlanSignals("pic", 1000, 100, 900, 500, 500, 12.0, False, 0.1)
    assert p.plans["pic"].tf.predict(s) == pytest.approx(1e-4 - 1e-7)
    exact = PlanSignals("pic", 1000, 100, 900, 500, 0, 12.0, False, 0.1)
    assert p.plans["pic"].tf.predict(exact) == 0.0


def test_the_where_features_read_where_the_left_out_tokens_sit(tmp_path: Path) -> None:
    fit = KLFit((-5.0, 0.0, 0.0, 0.0, 2.0, -1.0), 0.0, "where")
    near = PlanSignals("pic", 1000, 100, 900, 500, 500, 12.0, False, 0.1, reach=0, fresh=1000)
    far = PlanSignals("pic", 1000, 100, 900, 500, 500, 12.0, False, 0.1, reach=1000, fresh=0)
    assert fit.predict(near) == pytest.approx(1e-6 - 1e-7)  # -5 + 0 - 1
    assert fit.predict(far) == pytest.approx(1e-3 - 1e-7)  # -5 + 2 - 0
    p = predictor_for("m")
    p = Predictor(p.model_id, {"pic": type(p.plans["pic"])(fit, fit, 10)}, p.floors,
                  p.quantile, p.fitted_on)  # fmt: skip
    path = tmp_path / "p.json"
    p.save(path)
    assert load_predictor(path) == p


def test_the_model_read_features_need_their_read() -> None:
    fit = KLFit((-5.0, 0.0, 0.0, 0.0, 1.0), 0.0, "attn")
    s = PlanSignals("pic", 1000, 100, 900, 500, 500, 12.0, False, 0.1)
    with pytest.raises(ValueError, match="feature set attn needs the model-read signal"):
        fit.predict(s)
    assert fit.predict(replace(s, attn=0.1 - 1e-4)) == pytest.approx(1e-6 - 1e-7)  # -5 - 1
    dev = KLFit((-5.0, 0.0, 0.0, 0.0, 0.5), 0.0, "dev")
    assert dev.predict(replace(s, dev=1e-2 - 1e-8)) == pytest.approx(1e-6 - 1e-7)  # -5 - 1
    with pytest.raises(ValueError, match="feature set dev needs"):
        dev.predict(s)


@pytest.mark.parametrize(
    ("features", "coef", "message"),
    [
        ("probe_mass", [0.0] * 4, "unknown feature set 'probe_mass'"),
        ("where", [0.0] * 4, "coef must be 6 finite numbers for where"),
        ("base", [0.0] * 6, "coef must be 4 finite numbers for base"),
        ("attn", [0.0] * 5, "feature set 'attn' is read from the model"),
        ("dev", [0.0] * 5, "feature set 'dev' is read from the model"),
    ],
)
def test_a_feature_set_the_file_cannot_have_is_refused(
    tmp_path: Path, tiny_predictor: Predictor, features: str, coef: list[float], message: str
) -> None:
    raw = json.loads(tiny_predictor.to_json())
    raw["plans"]["pic"]["tf"] |= {"features": features, "coef": coef}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        load_predictor(path)


def test_another_version_is_refused(tmp_path: Path, tiny_predictor: Predictor) -> None:
    raw = json.loads(tiny_predictor.to_json()) | {"version": 99}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="version 99"):
        load_predictor(path)
    with pytest.raises(ConfigError, match="version 99"):  # from a spec, before any model
        StrategySpec.parse(f"plan:predictor={path}")


def test_an_unknown_plan_in_the_file_is_refused(tmp_path: Path, tiny_predictor: Predictor) -> None:
    raw = json.loads(tiny_predictor.to_json())
    raw["plans"]["warp"] = raw["plans"]["pic"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="unknown plan 'warp'"):
        load_predictor(path)


def _set(raw: dict[str, object], path: tuple[str, ...], value: object) -> None:
    at: object = raw
    for key in path[:-1]:
        at = at[key]  # type: ignore[index]
    at[path[-1]] = value  # type: ignore[index]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("floors", "high", "first"), float("nan"), "floors.high.first must be a finite number"),
        (("floors", "balanced", "tf"), -1.0, "floors.balanced.tf must be a finite number >= 0"),
        (("quantile",), 1e308, "quantile must be in \\(0, 1\\)"),
        (("plans", "pic", "turns"), -5, "plans.pic.turns must be a whole number >= 1"),
        (("plans", "pic", "first", "margin"), float("inf"), "margin must be a finite number"),
        (("plans",), [1], "plans must be an object, got list"),
        (("floors",), "x", "floors must be an object, got str"),
        (("plans", "pic", "first"), [1], "first must be an object, got list"),
        (("plans", "pic", "turns"), 1e400, "plans.pic.turns must be a whole number"),
    ],
    ids=["nan-floor", "negative-floor", "quantile", "turns", "inf-margin", "plans-list",
         "floors-str", "fit-list", "turns-inf"],
)  # fmt: skip
def test_a_number_out_of_range_or_a_wrong_shape_is_refused(
    tmp_path: Path, tiny_predictor: Predictor, path: tuple[str, ...], value: object, message: str
) -> None:
    """A NaN bound or margin makes every comparison with a prediction false: the planner's
    choice would be silently wrong, so the file is refused instead."""
    raw = json.loads(tiny_predictor.to_json())
    _set(raw, path, value)
    file = tmp_path / "p.json"
    file.write_text(json.dumps(raw))  # NaN and Infinity as Python writes them
    with pytest.raises(ConfigError, match=message):
        load_predictor(file)


def test_not_a_predictor_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a agentcache-plan-predictor file"):
        load_predictor(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_predictor(tmp_path / "missing.json")


def test_another_models_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match="fitted on model 'other'"):
        predictor_for("other").check_model("tiny-llama#0")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("plan:fidelity=perfect", "fidelity must be one of exact, high, balanced"),
        ("plan:kl=3", "kl must be in"),
        ("plan:kl=-0.1", "kl must be in"),
        ("plan:plans=exact+warp", "unknown plans \\['warp'\\]"),
        ("plan:plans=epic+pic", "hold no exact plan"),
        ("plan:min_gain=1.5", "min_gain must be in"),
        ("plan:speed=max", "unknown options \\['speed'\\]"),
    ],
)
def test_bad_options_fail_at_parse(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StrategySpec.parse(spec)


def test_the_shipped_predictor_reads_and_names_its_model() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    assert files
    for f in files:
        p = load_predictor(f)
        assert shipped_predictor(p.model_id) == p
        assert p.fitted_on["split"] == "tune"
        assert {"high", "balanced"} <= set(p.floors)
    assert shipped_predictor("tiny-llama") is None
