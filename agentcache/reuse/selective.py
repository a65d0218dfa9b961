"""Position-independent reuse with selective recompute: pic, epic, cacheblend, cacheslide, rpdc.

All five are one mechanism with different policies, chosen by `SelectiveOptions`:

    position plan (positions.py) : where reused chunks' keys go (true, mode, ccpe)
    up front      (upfront.py)   : base = update tokens, misses, boundary, last; candidates
    budget        (budget.py)    : how many candidates a ranking adds (ratio, extra, per_chunk)
    ranker        (ranking/)     : which ones: up front (offset), or from the evidence of a
                                   check pass (check.py), a probe pass (probe.py) or its own
    executor      (executor.py)  : re-rotated cached K/V loaded, the chosen tokens computed
                                   layer by layer, fresh K/V replacing (WCA: fused into) cached

`exact_prefix` marks reused segments whose whole preceding context and positions are the ones
they were computed with: their KV is exact, so they are neither recomputed nor checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import (
    PlannedPrefill,
    PlanningStrategy,
    PrefillResult,
    ReuseContext,
    ReuseStats,
    guarded,
)
from agentcache.reuse.check import checked
from agentcache.reuse.config import SelectiveOptions
from agentcache.reuse.executor import LayerExecutor, top
from agentcache.reuse.options import OPTION_TYPES, OptionType
from agentcache.reuse.plan_cost import selective_cost
from agentcache.reuse.positions import PLANS
from agentcache.reuse.probe import probed, select_all
from agentcache.reuse.ranking import RankingView
from agentcache.reuse.runs import ReusedRun, exact_mask, reused_runs
from agentcache.reuse.segments import SegmentHit, commit_segments, find_hits, leave_exact
from agentcache.reuse.upfront import UpFrontSelection, select_up_front
from agentcache.reuse.windowed import layer_loads
from agentcache.tiers.overlay import DirectKV, OverlayKV, PendingLoad

__all__ = [
    "ReusedRun",
    "SelectiveOptions",
    "SelectiveRecompute",
    "UpFrontSelection",
    "reused_runs",
    "select_up_front",
]


class SelectiveRecompute(PlanningStrategy):
    """Base of the position-independent strategies; subclasses set `defaults`."""

    defaults: ClassVar[SelectiveOptions] = SelectiveOptions()
    # tokens computed through every layer before anything reads their K/V are not loaded;
    # False loads every reused token (the reference path the fast one is tested against)
    skip_computed_loads: ClassVar[bool] = True
    # a sliding-window layer loads only the reused rows a query may read; False loads every
    # row on every layer (the reference path)
    skip_window_loads: ClassVar[bool] = True
    # a plan whose computed tokens are known up front, every token at its own index, runs as
    # exact prefix reuse's prefill (`compute_subset`, the context read in place); False runs
    # it through the layer executor (the reference path the fast one is tested against)
    prefix_compute: ClassVar[bool] = True

    def __init__(self, **options: Any) -> None:
        known = {f.name for f in fields(SelectiveOptions)}
        if unknown := set(options) - known:
            raise ConfigError(
                f"{self.name}: unknown options {sorted(unknown)}; known: {sorted(known)}"
            )
        if ("ratio" in options or "per_chunk" in options) and "extra" not in options:
            options = {**options, "extra": 0.0}  # a budget given replaces a default `extra`
        if {"ratio", "per_chunk", "extra"} & set(options) and "cover" not in options:
            options = {**options, "cover": 0.0}  # ... and a default `cover` with it
        if "cover" in options:  # a cover given (or dropped) states its floor and thin-turn rule
            options = {"cover_min": 0, "epic_over": 0.0, **options}
        self.options = replace(self.defaults, **options)
        self.ranker = self.options.ranker()
        self.plan = PLANS.get(self.options.plan)()

    @classmethod
    def option_types(cls) -> dict[str, OptionType]:
        return {f.name: OPTION_TYPES[str(f.type)] for f in fields(SelectiveOptions)}

    @property
    def up_front(self) -> bool:
        """The tokens it computes are known before any layer runs, at the prompt's own
        positions (its ranker is up front, or it ranks nothing): `select_up_front` says which."""
        return self.options.plan == "true" and self.options.evidence_pass is None

    def plan_prefill(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV
    ) -> PlannedPrefill | PrefillResult:
        """Handed over when the computed tokens are known up front at their own indices
        (nothing to reuse, the guard's `full`, or `prefix_compute`'s branch); else run whole
        through the layer executor (a ranking pass, moved positions, a decoupled load)."""
        stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
        hits = find_hits(ctx, prompt, stats)
        hits = self.plan.filter(ctx.model.forward, ctx.model.model_id, prompt, hits, stats)
        positions = self.plan.positions(prompt, hits)
        seq.extend(prompt.num_tokens)
        natural = torch.arange(prompt.num_tokens)
        if not hits:  # nothing to reuse: `full`'s own prefill, no selection machinery
            out: _Compute | _Done = _everything(prompt)
        else:
            out = self._reuse(ctx, prompt, seq, hits, positions, stats)
        if isinstance(out, _Compute):
            compute = out

            def after() -> None:
                e = compute.after()
                leave_exact(seq, prompt, hits, e.exact_kv, e.exact_runs, e.positions)

            return PlannedPrefill(compute.idx, natural, stats, after)
        e = out.exact
        leave_exact(seq, prompt, hits, e.exact_kv, e.exact_runs, e.positions)
        stats.close()
        return PrefillResult(out.logits, e.positions, stats)

    def _reuse(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV,
        hits: list[SegmentHit], positions: Tensor, stats: ReuseStats,
    ) -> _Compute | _Done:  # fmt: skip
        """The plan over `hits`: computed tokens handed over (`_Compute`) when known up front
        at their own indices, else run here (`_Done`)."""
        runs = reused_runs(prompt, hits, positions, self.options)
        sel = select_up_front(self.options, prompt.num_tokens, runs)
        computed = self._computed_up_front(sel, ctx.model.config.num_layers)
        # tokens computed through every layer before any read: loading them is wasted work
        skip = computed if computed is not None and self.skip_computed_loads else None
        load = sel.reused if skip is None else sel.reused & ~skip
        num_layers = ctx.model.config.num_layers
        rows = self._layer_loads(ctx, sel, computed, load)
        num_loaded = int(load.sum()) if rows is None else round(int(rows.sum()) / num_layers)
        cost = selective_cost(self.options, sel, computed, num_loaded, num_layers)
        natural = torch.arange(prompt.num_tokens)
        if guarded(ctx, prompt.num_tokens, cost, stats):  # `full`'s prefill is cheaper
            return _everything(prompt)
        kv = self._load(ctx, seq, hits, positions, load, rows)
        stats.reused_tokens = int(sel.reused.sum())
        stats.loaded_tokens = num_loaded
        stats.candidates = int((sel.candidates & ~sel.base).sum())
        stats.computed_anyway = int(sel.base.sum())
        stats.exact_plan = (  # (an up-front ranker's picks leave `candidates` empty)
            computed is not None
            and not bool((sel.reused & ~sel.exact & ~computed).any())
            and stats.context_copies_found == 0  # a context copy is not full recompute's KV
        )
        # the probe would only have ranked tokens computed anyway (`probed` skips it alike)
        probing = self.options.evidence_pass == "probe" and bool(sel.candidates.any())
        stats.probe_skipped = computed is not None and probing and not sel.epic_turn
        stats.epic_turn = sel.epic_turn

        def after(ever_computed: Tensor, dirty: Tensor) -> _Exact:
            """Once every computed token ran: the load's outcome, the counts, the masks."""
            stats.load_overlap = kv.finish()
            stats.load_s = kv.load_s  # decoupled: the loader thread's time, hidden or not
            for reason in kv.fallbacks:
                stats.fallback(reason)
            stats.recomputed_tokens = int(ever_computed.sum())
            stats.dirty = dirty & sel.reused
            stats.reused = sel.reused
            exact = sel.exact if self.options.exact_prefix else exact_mask(prompt, hits, positions)
            # a context copy's tokens run as exact here, but are not full recompute's KV
            stats.exact = exact & ~_context_copied(prompt, hits)
            # computed through every layer (a ranking pass: only the tokens it computes
            # anyway), or reused from a copy exact here
            # (a context copy's tokens are not: nothing after them counts as exact either, so
            # no exact copy is ever stored from KV computed after a context copy)
            fresh = computed if computed is not None else ~sel.reused
            return _Exact(fresh | stats.exact, exact, positions)

        as_prefix = self.prefix_compute and not ctx.decoupled_load
        if computed is not None and as_prefix and bool(torch.equal(positions, natural)):
            # the computed tokens known, every token at its own index: exact prefix reuse's
            # prefill over the loaded K/V (read in place), not the layer executor's; handed
            # over (`PlannedPrefill`) so it may run in chunks
            fresh = computed
            dirty = computed if num_layers > 1 else torch.zeros_like(computed)
            return _Compute(computed.nonzero().flatten(), lambda: after(fresh, dirty))
        ex = LayerExecutor(ctx, prompt, positions, stats, kv, self.options.fusion == "wca")
        if computed is not None:
            logits = ex.plain(computed.nonzero().flatten())
        else:
            logits = self._layers(ex, sel, runs)
        return _Done(logits, after(ex.ever_computed, ex.dirty))

    def _layer_loads(
        self, ctx: ReuseContext, sel: UpFrontSelection, computed: Tensor | None, load: Tensor
    ) -> Tensor | None:
        """(L, T) the rows of `load` each layer lands (a sliding-window layer: those a query
        may read, reuse/windowed.py); None: all of them on every layer."""
        if not self.skip_window_loads:
            return None
        if computed is not None:
            reach = computed
        elif self.options.evidence_pass == "check":  # layers before it run every inexact token
            reach = ~sel.exact
        else:
            reach = sel.base | sel.candidates
        return layer_loads(ctx.model.forward.spec, load, reach)

    def _computed_up_front(self, sel: UpFrontSelection, num_layers: int) -> Tensor | None:
        """(T,) the tokens the prefill runs through every layer, when known before any layer
        runs: the base when no ranking pass runs, base and every candidate when the probe
        would only rank tokens computed anyway (`probe_shortcut`); None: a pass decides."""
        run = self.options.evidence_pass if bool(sel.candidates.any()) else None
        if run is None or sel.epic_turn:  # `epic_over`'s chunk starts: nothing left to rank
            return sel.base.clone()
        o = self.options
        if run != "probe" or not o.probe_shortcut:
            return None
        probe = min(o.probe_layers, num_layers // 2)
        q_idx = sel.base.nonzero().flatten()
        cand = (sel.candidates & ~sel.base).nonzero().flatten()
        budget = min(len(cand), sel.budget)
        if not select_all(o.probe_redo, q_idx, cand, budget, probe, num_layers):
            return None
        return sel.base | sel.candidates

    def _layers(self, ex: LayerExecutor, sel: UpFrontSelection, runs: list[ReusedRun]) -> Tensor:
        """Dispatch to the pass that gathers the ranker's evidence."""
        run = self.options.evidence_pass
        if run == "check":
            return checked(ex, sel, runs, self.ranker, self.options)
        if run == "probe":
            return probed(ex, sel, runs, self.ranker, self.options)
        assert run == "own"
        cand = (sel.candidates & ~sel.base).nonzero().flatten()
        view = RankingView(cand, len(ex.ids), runs, sel.base, prefill=ex)
        picked = top(cand, self.ranker.scores(view), sel.budget)
        return ex.plain((sel.base.clone().index_fill_(0, picked, True)).nonzero().flatten())

    def _load(
        self, ctx: ReuseContext, seq: SequenceKV, hits: list[SegmentHit], positions: Tensor,
        load: Tensor, layer_rows: Tensor | None,
    ) -> DirectKV:  # fmt: skip
        """The cached K/V of the hits' tokens in mask `load`, re-rotated to `positions` (each
        layer by its own rotary; a sliding-window layer only its `layer_rows` (L, T)): landed
        in place, or (SLIDE decoupled load) landing layer by layer on a loader thread.

            hit    : [ h.start ...................... h.end )
            load   :   ####     ##########                    one PendingLoad per run of ##
        """
        slots, loads = seq.slots(), []
        for h in hits:
            for a, b in _runs(load[h.start : h.end]):
                span, rows = slice(h.start + a, h.start + b), slice(a, b)
                old, new = h.kv.positions[rows], positions[span]
                keys, values = h.kv.keys[:, rows], h.kv.values[:, rows]
                lr = None if layer_rows is None else layer_rows[:, span]
                loads.append(PendingLoad(slots[span], keys, values, old, new, lr))
        if layer_rows is not None:  # rows no layer query reads stay empty: never stored
            seq.holes = load & ~layer_rows.all(dim=0)
        rotary = ctx.model.forward.rotary  # each layer's own: NoPE layers' keys stay put
        if ctx.decoupled_load:
            return OverlayKV(seq, loads, rotary, load)
        return DirectKV.landed(seq, loads, rotary)

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        commit_segments(ctx, prompt, seq, positions)


@dataclass(frozen=True)
class _Exact:
    """What a selective prefill leaves for `commit_segments` (`leave_exact`): the (T,) masks
    of tokens whose K/V is exact (computed fresh through every layer, or reused exactly) and
    of reused tokens whose stored copy is exact here, and the positions the prompt was
    encoded at."""

    exact_kv: Tensor
    exact_runs: Tensor
    positions: Tensor


@dataclass(frozen=True)
class _Done:
    """A selective prefill run here: first-token logits and what it leaves."""

    logits: Tensor
    exact: _Exact


@dataclass(frozen=True)
class _Compute:
    """A selective plan whose computed tokens `idx` are known up front at their own indices:
    compute them (`compute_subset`), then `after` (the stats it sets then, what it leaves)."""

    idx: Tensor
    after: Callable[[], _Exact]


def _everything(prompt: TokenizedPrompt) -> _Compute:
    """`full`'s plan: every token computed, every token's K/V exact, none reused."""
    every, natural = _every(prompt), torch.arange(prompt.num_tokens)
    return _Compute(natural, lambda: _Exact(every, ~every, natural))


def _context_copied(prompt: TokenizedPrompt, hits: list[SegmentHit]) -> Tensor:
    """(T,) the tokens of hits found as their context copy."""
    mask = torch.zeros(prompt.num_tokens, dtype=torch.bool)
    for h in hits:
        if h.context_copy:
            mask[h.start : h.end] = True
    return mask


def _every(prompt: TokenizedPrompt) -> Tensor:
    return torch.ones(prompt.num_tokens, dtype=torch.bool)


def _runs(mask: Tensor) -> list[tuple[int, int]]:
    """(start, end) of every run of True in `mask` (n,)."""
    padded = torch.cat([torch.zeros(1), mask.float(), torch.zeros(1)])
    edges = padded.diff().nonzero().flatten().tolist()
    return list(zip(edges[::2], edges[1::2], strict=True))
