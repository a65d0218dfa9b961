"""The statistics a benchmark reports beside its medians: quantiles, a ratio's spread, and the
nearest-rank percentiles of latencies."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def quantile(xs: Iterable[float], p: float) -> float:
    """Linear interpolation between order statistics (numpy's default, 'inclusive').
    ValueError for no values."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of no values")
    k = (len(s) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def spread(xs: Sequence[float]) -> dict[str, float]:
    """The median of `xs` with its quartiles and range."""
    return {
        "median": statistics.median(xs),
        "q25": quantile(xs, 0.25),
        "q75": quantile(xs, 0.75),
        "min": min(xs),
        "max": max(xs),
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile (0 < q <= 1): the least value at or above which lie no
    more than a `1 - q` share of `values`; None for no values."""
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def tail(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50, p99 (nearest rank) and the count of `values` (None percentiles for none)."""
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99), "n": len(values)}
