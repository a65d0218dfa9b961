"""The cost guard: a reuse plan predicted to cost more than recomputing every token is not taken.

A plan's cost is counted before any layer runs, in the work it would do:

    token_layers     (token, layer) pairs through the projections and the MLP
    attention_pairs  (query, key) pairs over all layers, as model/run_attention.py computes
                     them: causal for a few contiguous query runs, blockwise otherwise
    loaded_tokens    tokens whose cached K/V is copied (and re-rotated) into the sequence
    model_calls      calls into the model (embed, per-layer project and attend, logits)

and weighed in token-layer units (`CostModel`, from the model's shapes: one unit is one
token's dense FLOPs in one layer). `guard(plan, full, costs)` compares it with `full`'s cost
for the same prompt; a strategy whose plan loses runs `full`'s prefill instead and says so
in `ReuseStats.guard` (`guarded`). The planner reads the same figures to choose among plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentcache.model.config import ModelConfig
from agentcache.model.run_attention import attention_pairs

# copying one K/V element into the pages and re-rotating it, in FLOP-equivalents: a memory
# copy and a few multiply-adds (a rough constant: loads are two to three orders of magnitude
# cheaper than computing the token, so its exact value does not move a decision)
LOAD_FLOPS_PER_ELEMENT = 8.0


@dataclass(frozen=True)
class CostModel:
    """Weights of a plan's counts, in token-layer units of the model's dense FLOPs."""

    attention_per_pair: float  # one (query, key) pair in one layer: QK^T and PV
    load_per_token_layer: float  # one token's K/V in one layer, copied and re-rotated
    num_layers: int

    @classmethod
    def of(cls, c: ModelConfig) -> CostModel:
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        dense = 2.0 * (c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size)
        return cls(4.0 * q / dense, 2 * kv * LOAD_FLOPS_PER_ELEMENT / dense, c.num_layers)


@dataclass(frozen=True)
class PlanCost:
    """What one prefill plan computes and loads (counts, not time)."""

    token_layers: float
    attention_pairs: float
    loaded_tokens: int
    model_calls: int

    def units(self, costs: CostModel) -> float:
        """The plan's cost in token-layers of dense compute."""
        return (
            self.token_layers
            + costs.attention_per_pair * self.attention_pairs
            + costs.load_per_token_layer * self.loaded_tokens * costs.num_layers
        )

    def __add__(self, other: PlanCost) -> PlanCost:
        return PlanCost(
            self.token_layers + other.token_layers,
            self.attention_pairs + other.attention_pairs,
            self.loaded_tokens + other.loaded_tokens,
            self.model_calls + other.model_calls,
        )


NOTHING = PlanCost(0.0, 0.0, 0, 0)


@dataclass(frozen=True)
class GuardDecision:
    """The plan's predicted cost against full recompute's; `taken` is whether the plan ran."""

    plan_units: float
    full_units: float
    taken: bool

    @property
    def ratio(self) -> float:
        return self.plan_units / max(self.full_units, 1e-9)


def pass_cost(idx: Tensor, num_context: int, num_layers: int) -> PlanCost:
    """Tokens `idx` (sorted) through `num_layers` layers over a context of `num_context`
    tokens, with K/V written (the pairs as `model.run_attention` computes them)."""
    n = len(idx)
    if n == 0 or num_layers == 0:
        return NOTHING
    pairs = attention_pairs(idx, num_context) * num_layers
    return PlanCost(float(n * num_layers), pairs, 0, 2 * num_layers)


def computed_cost(idx: Tensor, num_context: int, num_layers: int) -> PlanCost:
    """`pass_cost` of a whole prefill: embedding and logits calls included."""
    return pass_cost(idx, num_context, num_layers) + PlanCost(0.0, 0.0, 0, 2)


def full_cost(num_tokens: int, num_layers: int) -> PlanCost:
    """What `full` does: every token through every layer, causally."""
    return computed_cost(torch.arange(num_tokens), num_tokens, num_layers)


def loaded(num_tokens: int) -> PlanCost:
    return PlanCost(0.0, 0.0, num_tokens, 0)


def guard(plan: PlanCost, full: PlanCost, costs: CostModel) -> GuardDecision:
    """Take the plan unless it is predicted to cost more than recomputing everything."""
    p, f = plan.units(costs), full.units(costs)
    return GuardDecision(p, f, p <= f)
