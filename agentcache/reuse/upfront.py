"""What a selective prefill decides before any layer runs, from where reused runs sit alone
(no KV): the tokens computed anyway, the candidates a ranking may add, and its budget.

    tokens     : [ system ][ update ][ fixed A ][ fixed B ][ update ][last]
    reused     :  ########            #########  #########
    exact      :  ########                                        (exact_prefix)
    base       :            ########  kk         kk         ##########   (k: boundary_k)
    candidates :                      #########  #########

`starts=s` adds the first s candidates of every reused run not at index 0 to the base of a
turn its budget ranks (a per-message floor), after the budget is set: the basis of every
budget and of `cover` is the turn without them, so which turns are exact and how many
tokens a ranking adds do not change with it.

`epic_over=r` replaces the ranking on a turn whose budget is thin: when the candidates number
more than r per token computed anyway (a budget of `extra` per computed token refreshes fewer
than extra / r of them), the first `epic_k` tokens of every reused run not at index 0 whose KV
is not exact join the base and the budget is 0, so no ranking pass runs (EPIC's plan, decided
before any layer runs). Turns that `cover` makes exact, and turns with fewer candidates, keep
their plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.reuse.budget import BudgetBasis, openings
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.ranking import RankingView
from agentcache.reuse.runs import ReusedRun


@dataclass(frozen=True)
class UpFrontSelection:
    """Token masks (T,) before any layer runs. `base` is computed through every layer; the
    ranking (check layer or probe) picks `budget` more among `candidates` (none when the
    ranker is up front: its picks are in `base` already)."""

    reused: Tensor
    exact: Tensor
    base: Tensor
    candidates: Tensor
    budget: int
    epic_turn: bool = False  # `epic_over`: chunk starts computed instead of a ranking


def select_up_front(
    o: SelectiveOptions, num_tokens: int, runs: list[ReusedRun]
) -> UpFrontSelection:
    """Update tokens, misses and the last token; boundary tokens; with an up-front ranker,
    the budget's tokens in its order."""
    reused = torch.zeros(num_tokens, dtype=torch.bool)
    exact = torch.zeros(num_tokens, dtype=torch.bool)
    for r in runs:
        reused[r.start : r.end] = True
        exact[r.start : r.end] = r.exact
    # update tokens, missed segments and the last token, and boundary_k's openings
    base = ~reused | openings(runs, o.boundary_k, num_tokens)
    candidates = reused & ~exact
    pool = candidates & ~base
    budget = o.budget.tokens(BudgetBasis(int(candidates.sum()), int(base.sum()), runs, pool))
    left = int(pool.sum())
    ranked = budget < left
    if o.epic_over and ranked and left > o.epic_over * int(base.sum()):
        base = base | (openings(runs, o.epic_k, num_tokens) & pool)
        return UpFrontSelection(reused, exact, base, candidates, 0, epic_turn=True)
    if o.starts and ranked:  # a ranked turn: its runs' first tokens too
        base = base | (openings(runs, o.starts, num_tokens) & pool)
        pool = pool & ~base
        budget = min(budget, int(pool.sum()))
    ranker = o.ranker()
    if ranker.up_front:  # the run computes its picks with the base
        cand = pool.nonzero().flatten()
        scores = ranker.scores(RankingView(cand, num_tokens, runs, base))
        base = base.clone()
        base[cand[torch.argsort(scores, descending=True)[:budget]]] = True
        candidates = torch.zeros_like(candidates)
    return UpFrontSelection(reused, exact, base, candidates, budget)
