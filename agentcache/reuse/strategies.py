"""The registered position-independent strategies: settings of `SelectiveRecompute`.

| name       | reuses                   | recomputes                                        |
|------------|--------------------------|---------------------------------------------------|
| pic        | every cached segment     | update tokens + last token (quality floor)        |
| epic       | every cached segment     | + first k=64 tokens of each non-first chunk       |
| cacheblend | every cached segment     | layer 0 all; top r=0.15 by layer-1 key deviation  |
| cacheslide | every cached segment     | WCA: layer 0 all; top rho=0.26 fused, tau gating  |
| rpdc       | exact prefix as is; rest | probe pass; 0.2 extra tokens per computed token,  |
|            |                          | ranked by the attention of the last 128 computed; |
|            |                          | all of them when they number <= 1.5 per computed  |
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
    """The paper's WCA, its open choices settled: deviation read at layer 1, literal fusion
    weight, gating every 4 layers with tau on 1 - CKSim; removal only unless promotion is set."""

    name = "cacheslide"
    defaults = SelectiveOptions(check_layer=1, ratio=0.26, fusion="wca", gate_every=4, tau=0.12)


@STRATEGIES.register("rpdc")
class RPDC(SelectiveRecompute):
    """agentcache's default. Keeps what the data showed works and drops what it showed broken:
    segments whose context is unchanged are kept exactly (no layer-0 pass over them); reused
    tokens are ranked not by layer-1 key deviation (which missed the tokens the answer
    depends on) but by the attention the last 128 always-computed tokens pay them over the
    first 10 layers of a probe pass; recomputed K/V replace cached (no fusion).

    The budget is `extra=0.2`: 0.2 reused tokens recomputed per token a perfect cache would
    compute anyway (update tokens, misses, the last), so TTFT stays within about 1.3x of a
    perfect cache's whatever the share of reused tokens (docs/benchmarks.md). `ratio=r`
    instead budgets a fraction r of the reused tokens (the earlier default was
    `rpdc:ratio=0.3:probe_window=256`).

    Per turn, `cover=1.5` chooses exactness where it is cheap: when the reused tokens whose
    context changed number at most 1.5 per token computed anyway, all of them are computed
    (output equal to full recompute, no probe), so such a turn costs at most 2.5x a perfect
    cache. The value is the smallest that brought greedy agreement to 0.9 on every agent
    family's tuning sessions (docs/benchmarks.md); `cover=0` is the default before it.

    `cover_min=256` is its floor: a turn with at most 256 such tokens computes them all,
    however few it computes anyway. A turn that appends a short message after a short moved
    span (a cleared tool result, a compaction, a repeated tool output) would otherwise rank a
    handful of tokens at a probe's cost and pass approximate K/V on to every later turn; the
    agent families' ranked turns have hundreds of candidates and are untouched
    (docs/benchmarks.md, "Cover's floor" and "The default gains `cover_min=256`"). A spec
    that sets `cover` or a budget without `cover_min` has no floor: `rpdc:cover=1.5` is the
    default before it.
    `epic_over=4`: a turn it would rank whose candidates number more than 4 per token
    computed anyway computes EPIC's chunk starts instead (the first 64 tokens of every moved
    segment; no probe). There the budget of 0.2 per computed token would refresh under 5% of
    the stale tokens: a system message rewritten before a history of short messages, where
    the probe's picks left greedy agreement at 0.80 on validation and the chunk starts reach
    0.90 (docs/benchmarks.md, "The default gains `epic_over=4`"). `rpdc:epic_over=0`
    is the default before it; a spec that sets `cover` or a budget without `epic_over` has
    none either (`rpdc:cover=0`, `rpdc:extra=0.5` mean what they meant before it).
    `min_ratio=m` (not set here) ranks at least ceil(m x candidates) of them however few
    tokens the turn computes anyway (docs/benchmarks.md, "A floor in the stale tokens")."""

    name = "rpdc"
    defaults = SelectiveOptions(
        probe_layers=10, probe_window=128, extra=0.2, cover=1.5, cover_min=256, epic_over=4.0,
        exact_prefix=True, selection="attention",
    )  # fmt: skip
