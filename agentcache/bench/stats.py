"""The statistics a benchmark reports beside its medians: quantiles and a ratio's spread."""

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
