"""The recompute budget: how many reused tokens a ranking may select, as one tagged value.

    RatioOfReused(r)      ceil(r * candidates)            cacheblend's r, cacheslide's rho
    PerComputedToken(e)   ceil(e * always-computed)       a bound on TTFT over a perfect cache
    EpicCount(k)          EPIC's token count at k         a comparison with EPIC at its cost

Spec options `ratio=`, `extra=` and `per_chunk=` parse into it (`SelectiveOptions.budget`);
`min_ratio=m` puts a floor of ceil(m * candidates) under `extra` or `per_chunk`.
`cover=c` wraps any of them: when the candidates number at most c per always-computed token,
the budget is all of them (the turn is exact, and costs at most 1 + c times a perfect cache).
`cover_min=n` is its floor in tokens: n or fewer candidates are all computed too, however few
tokens the turn computes anyway (a ranking pass has a cost of its own that `computed` does not
count; `rpdc`'s value is derived from its probe's, reuse/strategies.py).

    exact  <=>  candidates <= max(cover * computed, cover_min)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from agentcache.reuse.runs import ReusedRun


class BudgetBasis(NamedTuple):
    """What a budget is measured against, known before any layer runs."""

    candidates: int  # reused tokens whose KV is not exact (boundary tokens included)
    computed: int  # tokens computed anyway: update tokens, misses, boundary and last
    runs: list[ReusedRun]
    pool: Tensor  # (T,) bool: candidates not computed anyway


@dataclass(frozen=True)
class RatioOfReused:
    ratio: float

    def tokens(self, basis: BudgetBasis) -> int:
        return math.ceil(self.ratio * basis.candidates)


@dataclass(frozen=True)
class PerComputedToken:
    extra: float

    def tokens(self, basis: BudgetBasis) -> int:
        return math.ceil(self.extra * basis.computed)


@dataclass(frozen=True)
class EpicCount:
    """The candidates among the first `per_chunk` tokens of every reused run not at index 0
    whose KV is not exact: what `epic` with boundary_k=per_chunk recomputes."""

    per_chunk: int

    def tokens(self, basis: BudgetBasis) -> int:
        return epic_tokens(basis.runs, basis.pool, self.per_chunk)


@dataclass(frozen=True)
class AtLeastRatio:
    """`within`'s tokens, but at least a fraction `ratio` of the candidates: a floor in the
    stale tokens themselves, for a turn that computes little beside many of them (an edit
    early in a long history and a short new message)."""

    within: PerComputedToken | EpicCount
    ratio: float

    def tokens(self, basis: BudgetBasis) -> int:
        return max(self.within.tokens(basis), math.ceil(self.ratio * basis.candidates))


@dataclass(frozen=True)
class Covered:
    """All candidates when they are few beside the tokens computed anyway (`cover` per computed
    token) or few outright (`floor` tokens), else `within`."""

    within: RatioOfReused | PerComputedToken | EpicCount | AtLeastRatio
    cover: float
    floor: int = 0

    def tokens(self, basis: BudgetBasis) -> int:
        pool = int(basis.pool.sum())
        if pool <= max(self.cover * basis.computed, self.floor):
            return pool
        return self.within.tokens(basis)


Budget = RatioOfReused | PerComputedToken | EpicCount | AtLeastRatio | Covered


def openings(runs: list[ReusedRun], k: int, num_tokens: int) -> Tensor:
    """(T,) bool: the first k tokens of every reused run not at index 0 whose KV is not exact
    (`boundary_k`'s tokens, `starts`' and `epic_over`'s)."""
    mask = torch.zeros(num_tokens, dtype=torch.bool)
    for r in runs:
        if r.start > 0 and not r.exact:
            mask[r.start : r.start + min(k, r.num_tokens)] = True
    return mask


def epic_tokens(runs: list[ReusedRun], candidates: Tensor, k: int) -> int:
    """Candidates among the first k tokens of every run not at index 0: EPIC's token count."""
    return int((openings(runs, k, candidates.shape[0]) & candidates).sum())
