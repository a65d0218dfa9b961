"""Strategy specs are read by each option's declared type; every bad spec is a ConfigError
that names the option, found before any model exists."""

from __future__ import annotations

import pytest

from agentcache.errors import ConfigError
from agentcache.reuse import STRATEGIES, StrategySpec
from agentcache.runtime import EngineConfig


@pytest.mark.parametrize(
    ("text", "option", "value"),
    [
        ("cacheslide:plan=true", "plan", "true"),
        ("cacheslide:promotion=none", "promotion", "none"),
        ("cacheblend:check_layer=none:probe_layers=2:selection=attention", "check_layer", None),
        ("rpdc:probe_redo=TRUE", "probe_redo", True),
        ("rpdc:extra=1", "extra", 1.0),
        ("epic:boundary_k=16", "boundary_k", 16),
    ],
)
def test_values_take_the_options_declared_type(text: str, option: str, value: object) -> None:
    spec = StrategySpec.parse(text)
    assert spec.options[option] == value
    assert type(spec.options[option]) is type(value)
    built = spec.build()
    assert getattr(built.options, option) == value  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("cacheslide:plan=yes", ["plan must be one of true, mode, ccpe", "'yes'"]),
        ("cacheslide:promotion=null", ["promotion must be one of none, catch-up"]),
        ("rpdc:probe_redo=1", ["probe_redo must be true or false, got '1'"]),
        ("rpdc:ratio=nan", ["ratio must be a number, got 'nan'"]),
        ("rpdc:boundary_k=1.5", ["boundary_k must be an integer, got '1.5'"]),
        ("rpdc:check_layer=x", ["check_layer must be an integer or none"]),
        ("rpdc:check_layer=-1:probe_layers=0", ["check_layer must be >= 0"]),
        ("rpdc:nosuch=1", ["unknown options ['nosuch']", "probe_window"]),
        ("full:ratio=0.1", ["full takes no options"]),
        ("pic:extra=0.5", ["needs a ranking to spend it", "selection=offset"]),
        ("rpdc:ratio=0.2:per_chunk=8", ["alternative budgets"]),
    ],
)
def test_bad_specs_name_the_option(text: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        StrategySpec.parse(text)
    for needle in needles:
        assert needle in str(e.value)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"plan": True}, "plan must be a string, got True"),
        ({"promotion": None}, "promotion must be a string, got None"),
        ({"tau": float("inf")}, "tau must be a number, got inf"),
    ],
)
def test_python_options_are_checked_as_strictly(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EngineConfig(strategy="cacheslide", strategy_options={"cacheslide": options})


def test_every_registered_strategy_declares_types_its_constructor_takes() -> None:
    for name in STRATEGIES.names():
        for option, kind in STRATEGIES.get(name).option_types().items():
            assert kind.words  # every type says what it accepts
            with pytest.raises(ConfigError, match=option):
                StrategySpec.parse(f"{name}:{option}=\x01")
