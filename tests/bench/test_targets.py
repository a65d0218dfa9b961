from __future__ import annotations

from tests.bench.scripts import load_script


def test_ttft_against_prefix_is_the_median_of_per_turn_ratios_not_of_medians() -> None:
    targets = load_script("targets")
    ms = {"rpdc": [40.0, 70.0, 85.0, 100.0, 130.0], "prefix": [50.0, 100.0, 90.0, 100.0, 100.0]}
    turns = [
        {"session": "s", "turn": t, "strategy": label, "ttft_ms": values[t - 1]}
        for label, values in ms.items()
        for t in range(1, 6)
    ]
    cold = [{"session": "s", "turn": 0, "strategy": x, "ttft_ms": 1.0} for x in ms]
    got = targets.vs_base({"turns": cold + turns}, "rpdc", "prefix")
    assert round(got, 3) == 0.944  # per turn 0.8, 0.7, 0.944, 1.0, 1.3; medians 85/100 = 0.85
