"""`SelectiveOptions`: the typed, validated settings of selective recompute, as specs and
`EngineConfig.strategy_options` give them; they name the policies a prefill runs (position
plan, budget, ranker and the pass that feeds it, fusion)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from agentcache.errors import ConfigError
from agentcache.reuse import ccpe  # noqa: F401  (registers the ccpe plan)
from agentcache.reuse.budget import (
    AtLeastRatio,
    Budget,
    Covered,
    EpicCount,
    PerComputedToken,
    RatioOfReused,
)
from agentcache.reuse.options import OPTION_TYPES, check_choice
from agentcache.reuse.positions import PLANS
from agentcache.reuse.ranking import RANKERS, RankerConfig, TokenRanker

FUSIONS = ("replace", "wca")
PROMOTIONS = ("none", "catch-up")
CHUNKS = ("segment", "span")
CHOICES = {
    "plan": tuple(PLANS.names()),
    "fusion": FUSIONS,
    "promotion": PROMOTIONS,
    "selection": tuple(RANKERS.names()),
    "chunks": CHUNKS,
}


@dataclass(frozen=True)
class SelectiveOptions:
    boundary_k: int = 0  # first k tokens of every reused segment not at index 0 (EPIC)
    # a ranked turn also computes the first `starts` tokens of every reused segment not at
    # index 0 whose KV is not exact (a per-message floor), counted in no budget's basis and
    # not in `cover`'s: which turns are exact, and the ranked budget, stay what they are
    starts: int = 0
    # when > 0: a turn the budget would rank whose candidates number more than `epic_over`
    # per token computed anyway (the budget refreshes a sliver of them) computes the first
    # `epic_k` of every reused segment not at index 0 whose KV is not exact instead (EPIC's
    # chunk starts, known up front: no ranking pass), and no ranked tokens
    epic_over: float = 0.0
    epic_k: int = 64
    # what offset order counts offsets from: the start of every reused segment (EPIC), or of
    # every span of reused segments that were stored next to each other, after the same
    # context, and sit next to each other again (inside a span no token's local context
    # changed, so offsets grow from where the context did change)
    chunks: str = "segment"
    check_layer: int | None = None  # layer whose key deviation ranks tokens; None: no check
    ratio: float = 0.0  # fraction of reused tokens recomputed by deviation rank
    # when > 0, the budget is instead `extra` tokens per always-computed token (update tokens,
    # misses, boundary and last): a bound on TTFT over a perfect cache, not on reused tokens
    extra: float = 0.0
    # when > 0, the budget is instead the reused tokens EPIC's boundary_k=per_chunk would
    # recompute (the first per_chunk of every reused segment not at index 0 whose KV is not
    # exact), spent in the selection's order: a comparison with EPIC at its own token count
    per_chunk: int = 0
    # when > 0, a floor under the `extra` or `per_chunk` budget: at least this fraction of the
    # reused tokens, so a turn that computes little beside many stale tokens refreshes some
    min_ratio: float = 0.0
    # when > 0: a turn whose candidates number at most `cover` per always-computed token
    # computes them all (exact; the probe is skipped), whatever the budget above says
    cover: float = 0.0
    # cover's floor, in tokens: a turn with at most `cover_min` candidates computes them all
    # too, however few tokens it computes anyway (exact; the probe is skipped)
    cover_min: int = 0
    fusion: str = "replace"  # recomputed K/V replace cached, or WCA's weighted fusion
    gate_every: int = 0  # WCA: every n layers, converged tokens leave the recompute set
    tau: float = 0.12  # WCA: 1 - CKSim < tau means converged
    promotion: str = "none"  # WCA: refill the set after removals ("catch-up" computes them)
    # CCPE plan for reused chunks: true positions, most frequent start, or (CoPE models only)
    # reuse where the chunk's CoPE encoding is the task's most frequent one (reuse/ccpe.py)
    plan: str = "true"
    exact_prefix: bool = False  # skip recompute for segments whose context is unchanged
    # rank by key deviation, by the attention the computed tokens pay (attention), by their
    # product (weighted), at random (an ablation: same budget, random tokens), or by offset
    # within their chunk, chunk starts first (EPIC's order with the budget spread evenly:
    # chosen before any layer runs, so no check or probe pass)
    selection: str = "deviation"
    seed: int = 0
    # probe: run the always-computed tokens through the first `probe_layers` layers over the
    # cached KV, rank reused tokens by the attention the last `probe_window` prompt tokens pay
    # them, then bring the top of the budget up to that layer and carry both through the rest
    probe_layers: int = 0
    probe_window: int = 32
    # probe: after selection, recompute the probe layers of the always-computed tokens that
    # follow the first selected token, so that they attend to the selected tokens' fresh K/V
    # there too (otherwise their probe-layer states saw the cached K/V)
    probe_redo: bool = False
    # probe: when the budget covers every candidate (or, with `probe_redo`, leaves out fewer
    # token-layers than the redo would cost), compute them all and skip the probe: exact, and
    # never more compute. False always runs the probe (the reference path it is tested against)
    probe_shortcut: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):  # values from Python arrive unchecked
            OPTION_TYPES[str(f.type)].check(f.name, getattr(self, f.name))
        for name, allowed in CHOICES.items():
            check_choice(name, getattr(self, name), allowed)
        self._check_ranges()
        self._check_ranking()

    def _check_ranges(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ConfigError(f"ratio must be in [0, 1], got {self.ratio:g}")
        if not self.extra >= 0.0:
            raise ConfigError(f"extra must be >= 0, got {self.extra:g}")
        if not self.cover >= 0.0:
            raise ConfigError(f"cover must be >= 0, got {self.cover:g}")
        if self.cover_min < 0:
            raise ConfigError(f"cover_min must be >= 0, got {self.cover_min}")
        if self.per_chunk < 0:
            raise ConfigError(f"per_chunk must be >= 0, got {self.per_chunk}")
        if not self.epic_over >= 0.0:
            raise ConfigError(f"epic_over must be >= 0, got {self.epic_over:g}")
        if self.epic_k < 1:
            raise ConfigError(f"epic_k must be >= 1, got {self.epic_k}")
        if sum(b > 0 for b in (self.ratio, self.extra, self.per_chunk)) > 1:
            raise ConfigError("ratio, extra and per_chunk are alternative budgets: set one")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ConfigError(f"min_ratio must be in [0, 1], got {self.min_ratio:g}")
        if self.min_ratio > 0 and not (self.extra > 0 or self.per_chunk > 0):
            raise ConfigError("min_ratio floors an extra or per_chunk budget: set one of them "
                              "(with ratio, the ratio itself is the fraction)")  # fmt: skip
        if (
            min(self.boundary_k, self.starts, self.gate_every, self.probe_layers) < 0
            or self.probe_window < 1
        ):
            raise ConfigError(
                "boundary_k, starts, gate_every, probe_layers must be >= 0, probe_window >= 1"
            )
        if self.check_layer is not None and self.check_layer < 0:
            raise ConfigError(f"check_layer must be >= 0 or none, got {self.check_layer}")
        if self.probe_layers and self.check_layer is not None:
            raise ConfigError("probe_layers and check_layer are alternative selections: set one")

    def _check_ranking(self) -> None:
        """The ranker can read the pass these options run, and something spends the budget."""
        ranker, run = RANKERS.get(self.ranker_name), self.evidence_pass
        if run is not None and run not in ranker.passes():
            where = [n for n in RANKERS.names() if run in RANKERS.get(n).passes()]
            needs = ", ".join(_PASS_OPTIONS[p] for p in ranker.passes())
            raise ConfigError(
                f"selection={self.selection} cannot rank in the {run} pass "
                f"({_PASS_OPTIONS[run]}); it needs {needs}; the {run} pass ranks with "
                f"selection={' or '.join(where)}"
            )
        has_budget = self.ratio > 0 or self.extra > 0 or self.per_chunk > 0 or self.covers
        if has_budget and run is None and not ranker.up_front:
            raise ConfigError(
                "a budget (ratio, extra, per_chunk, cover or cover_min) needs a ranking to "
                "spend it: set selection=offset or span-offset (up front), selection=query "
                "(its own probe), probe_layers or check_layer"
            )

    @property
    def evidence_pass(self) -> str | None:
        """The pass that gathers the ranker's evidence: "check" (check_layer), "probe"
        (probe_layers), "own" (the ranker probes by itself), None (up front, or no ranking)."""
        ranker = RANKERS.get(self.ranker_name)
        if ranker.up_front:
            return None
        if self.check_layer is not None:
            return "check"
        if self.probe_layers:
            return "probe"
        return "own" if "own" in ranker.passes() else None

    @property
    def ranker_name(self) -> str:
        if self.selection == "offset" and self.chunks == "span":
            return "span-offset"
        return self.selection

    def ranker(self) -> TokenRanker:
        return RANKERS.get(self.ranker_name)(RankerConfig(self.seed, self.probe_window))

    @property
    def budget(self) -> Budget:
        within: RatioOfReused | PerComputedToken | EpicCount | AtLeastRatio
        if self.extra > 0:
            within = PerComputedToken(self.extra)
        elif self.per_chunk > 0:
            within = EpicCount(self.per_chunk)
        else:
            within = RatioOfReused(self.ratio)
        if self.min_ratio > 0 and not isinstance(within, RatioOfReused):
            within = AtLeastRatio(within, self.min_ratio)
        return Covered(within, self.cover, self.cover_min) if self.covers else within

    @property
    def covers(self) -> bool:
        """Some turns are made exact by their few candidates (`cover` or `cover_min` set)."""
        return self.cover > 0 or self.cover_min > 0


_PASS_OPTIONS = {
    "check": "check_layer set",
    "probe": "probe_layers > 0",
    "own": "its own probe: probe_layers=0 and no check_layer",
}
