from __future__ import annotations

from typing import Any

import pytest

from tests.bench.scripts import load_script


def rec(strategy: str, turn: int, ttft: float, reused: int, recomputed: int) -> dict[str, Any]:
    return {"session": "w-01", "workload": "w", "case": "swing", "turn": turn,
            "strategy": strategy, "prompt_tokens": 1000, "ttft_ms": ttft,
            "ttft_limit_ms": 100.0, "reused_tokens": reused,
            "recomputed_tokens": recomputed}  # fmt: skip


def test_ceiling_is_prefix_over_the_perfect_cache_on_warm_turns_only() -> None:
    c = load_script("reuse/ceiling")
    turns = [
        rec("prefix", 0, 900.0, 0, 1000),  # cold turn: skipped
        rec("pic", 0, 900.0, 0, 1000),
        rec("prefix", 1, 300.0, 400, 600),  # prefix computes 600 tokens in 300 ms
        rec("pic", 1, 110.0, 800, 200),  # the perfect cache computes 200
        rec("rpdc", 1, 150.0, 700, 300),
        rec("prefix", 2, 150.0, 800, 200),
        rec("pic", 2, 120.0, 900, 100),
    ]
    out = c.ceilings([{"turns": turns}])
    assert [(t.turn, t.ttft, t.tokens, t.measured) for t in out] == [
        (1, 3.0, 3.0, 2.0),
        (2, 1.5, 2.0, None),
    ]
    md = c.table(out, 2.0, "rpdc")
    assert "| w | swing | 2 | 2.25x | 2.50x | 1 of 2 | 2.00x |" in md


def test_ceiling_needs_the_perfect_cache_token_count() -> None:
    c = load_script("reuse/ceiling")
    turns = [rec("prefix", 1, 300.0, 400, 600)]
    with pytest.raises(ValueError, match="pic"):
        c.ceilings([{"turns": turns}])
