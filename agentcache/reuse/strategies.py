"""The registered position-independent strategies: settings of `SelectiveRecompute`.

| name       | reuses                   | recomputes                                        |
|------------|--------------------------|---------------------------------------------------|
| pic        | every cached segment     | update tokens + last token (quality floor)        |
| epic       | every cached segment     | + first k=64 tokens of each non-first chunk       |
| cacheblend | every cached segment     | layer 0 all; top r=0.15 by layer-1 key deviation  |
| cacheslide | every cached segment     | WCA: layer 0 all; top rho=0.26 fused, tau gating  |
| rpdc       | exact prefix as is; rest | layer 0 of the rest; boundary k=16 + top r=0.15   |
"""

from __future__ import annotations

from agentcache.reuse.base import STRATEGIES
from agentcache.reuse.selective import SelectiveOptions, SelectiveRecompute


@STRATEGIES.register("pic")
class NaivePIC(SelectiveRecompute):
    name = "pic"
    defaults = SelectiveOptions()


@STRATEGIES.register("epic")
class EPIC(SelectiveRecompute):
    name = "epic"
    defaults = SelectiveOptions(boundary_k=64)


@STRATEGIES.register("cacheblend")
class CacheBlend(SelectiveRecompute):
    name = "cacheblend"
    defaults = SelectiveOptions(check_layer=1, ratio=0.15)


@STRATEGIES.register("cacheslide")
class CacheSlide(SelectiveRecompute):
    """The paper's WCA as DESIGN.md resolves it: deviation read at layer 1, literal fusion
    weight, gating every 4 layers with tau on 1 - CKSim; removal only unless promotion is set."""

    name = "cacheslide"
    defaults = SelectiveOptions(check_layer=1, ratio=0.26, fusion="wca", gate_every=4, tau=0.12)


@STRATEGIES.register("rpdc")
class RPDC(SelectiveRecompute):
    """agentcache's default: exact prefix kept as is, chunk-boundary tokens always recomputed,
    deviation-ranked tokens recomputed with full replacement."""

    name = "rpdc"
    defaults = SelectiveOptions(boundary_k=16, check_layer=1, ratio=0.15, exact_prefix=True)
