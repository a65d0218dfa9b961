from __future__ import annotations

from typing import Any

from tests.bench.scripts import load_script


def row(compute: float, kl_first: float, kl_tf: float) -> dict[str, Any]:
    return {"recompute_fraction_mean": compute, "kl_first_token_mean": kl_first,
            "tf_kl_mean": kl_tf}  # fmt: skip


def test_dominance_names_the_cheapest_winner_or_the_nearest_above() -> None:
    f = load_script("reuse/frontier")
    rows = {
        "epic": row(0.40, 1e-4, 1e-4),
        "cacheblend": row(0.30, 1e-3, 1e-3),
        "rpdc": row(0.25, 5e-4, 5e-4),  # beats cacheblend, not epic
        "rpdc:extra=0.5": row(0.39, 2e-4, 5e-5),  # cheaper than epic, worse first-token KL
        "rpdc:extra=1": row(0.44, 5e-5, 5e-5),  # as faithful as epic, 10% dearer
        "rpdc:extra=2": row(0.60, 0.0, 0.0),
    }
    out = {base: (win, near) for base, win, near, _ in f.dominance(rows, "rpdc")}
    assert out["cacheblend"] == ("rpdc", None)
    assert out["epic"] == (None, "rpdc:extra=1")
    table = f.table({("w", "swing"): rows}, "rpdc")
    assert "none; at +10% compute: rpdc:extra=1" in table
    assert f.curve("rpdc:selection=offset:extra=1") == "rpdc (offset)"
    assert f.curve("rpdc:extra=1") == "rpdc"


def test_at_equal_cost_the_more_faithful_wins_and_a_tie_is_labelled() -> None:
    f = load_script("reuse/frontier")
    rows = {
        "epic": row(0.40, 1e-4, 1e-4),
        "rpdc:a": row(0.40, 1e-4, 1e-4),  # the same figures: a tie
        "rpdc:b": row(0.40, 5e-5, 2e-5),  # as costly, more faithful
    }
    out = {base: win for base, win, _, _ in f.dominance(rows, "rpdc")}
    assert out["epic"] == "rpdc:b"
    del rows["rpdc:b"]
    assert "rpdc:a (tie: the same figures)" in f.table({("w", "shift"): rows}, "rpdc")
    assert f.curve("rpdc:selection=offset:chunks=span:per_chunk=64") == "rpdc (offset, span)"
