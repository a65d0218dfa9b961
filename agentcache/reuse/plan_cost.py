"""A selective prefill's predicted cost, from what is decided before any layer runs.

    plan known up front (`computed` set): those tokens through every layer, the rest loaded
    probe pass : base through the probe layers (the window scoring the whole context), the
                 budget's picks through them too, base + picks through the remaining layers
    check pass : every token whose KV is not exact through layers 0..c, base + picks after
    own probe  : the window through every layer over the reused context, then base + picks

Picks are not known before the ranking runs: they are counted as scattered tokens, each
against half the context (the blockwise masked attention's average).
"""

from __future__ import annotations

from torch import Tensor

from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.guard import NOTHING, PlanCost, computed_cost, loaded, pass_cost
from agentcache.reuse.upfront import UpFrontSelection


def selective_cost(
    o: SelectiveOptions,
    sel: UpFrontSelection,
    computed: Tensor | None,
    num_loaded: int,
    num_layers: int,
) -> PlanCost:
    """The plan's cost; `computed` (T,) bool is the set run through every layer when known up
    front (None: a ranking pass decides), `num_loaded` the tokens whose cached K/V is loaded."""
    t = len(sel.base)
    if computed is not None:
        return computed_cost(computed.nonzero().flatten(), t, num_layers) + loaded(num_loaded)
    base = sel.base.nonzero().flatten()
    picks = min(sel.budget, int((sel.candidates & ~sel.base).sum()))
    calls = PlanCost(0.0, 0.0, 0, 2)  # embed and logits
    run = o.evidence_pass
    if run == "probe":
        probe = min(o.probe_layers, num_layers // 2)
        cost = pass_cost(base, t, probe) + _window(o.probe_window, base, t, probe)
        cost += _scattered(picks, t, probe) + _after(base, picks, t, num_layers - probe)
    elif run == "check":
        c = o.check_layer
        assert c is not None
        cost = pass_cost((~sel.exact).nonzero().flatten(), t, c + 1)
        cost += _after(base, picks, t, num_layers - c - 1)
    elif run == "own":
        window = base[-o.probe_window :]
        cost = _window(o.probe_window, window, t, num_layers) + pass_cost(window, t, num_layers)
        cost += _after(base, picks, t, num_layers)
    else:
        cost = NOTHING
    return cost + calls + loaded(num_loaded)


def _scattered(n: int, num_context: int, num_layers: int) -> PlanCost:
    return PlanCost(float(n * num_layers), n * num_context / 2 * num_layers, 0, 0)


def _after(base: Tensor, picks: int, num_context: int, num_layers: int) -> PlanCost:
    """Base and picks together through `num_layers`: picks scatter the query set."""
    if picks == 0:
        return pass_cost(base, num_context, num_layers)
    cost = pass_cost(base, num_context, num_layers)
    return cost + _scattered(picks, num_context, num_layers)


def _window(window: int, base: Tensor, num_context: int, num_layers: int) -> PlanCost:
    """The window's attention scores over the whole context, besides its own attention."""
    n = min(window, len(base))
    return PlanCost(0.0, float(n * num_context * max(0, num_layers - 1)), 0, 0)
