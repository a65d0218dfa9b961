"""Position-independent reuse with selective recompute: pic, epic, cacheblend, cacheslide, rpdc.

All five are one mechanism with different selection and fusion settings:

    prompt : [ system ][ update (new length) ][ fixed A ][ fixed B ][ update ][last]
    cached :  reused                            reused     reused
    plan   :  positions 0..T-1; cached keys re-rotated from their stored positions
    layer 0..c-1 : every non-exact token computed fresh          (check strategies only)
    layer c      : deviation d_i = ||K_i(fresh) - K_i(cached)||^2 of reused tokens
                   Q = update tokens + last token + boundary tokens + top-ratio by d_i
    layer > c    : only Q computed; Q's fresh K/V replace (or, WCA, are fused into) cached;
                   every query attends causally over all T tokens' K/V

`exact_prefix` marks reused segments whose whole preceding context and positions are the ones
they were computed with: their KV is exact, so they are neither recomputed nor checked.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import chain_id, content_id
from agentcache.model.config import ModelConfig
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.base import (
    PrefillResult,
    ReuseContext,
    ReuseStats,
    ReuseStrategy,
    compute_subset,
)
from agentcache.reuse.layers import TimedForward
from agentcache.reuse.ccpe import CCPEPlan
from agentcache.reuse.options import OPTION_TYPES, OptionType, check_choice
from agentcache.reuse.segments import REUSABLE, SegmentHit, commit_segments, context_ids, find_hits
from agentcache.tiers.overlay import DirectKV, OverlayKV, PendingLoad

PLANS = ("true", "mode", "ccpe")
FUSIONS = ("replace", "wca")
PROMOTIONS = ("none", "catch-up")
SELECTIONS = ("deviation", "attention", "weighted", "random", "offset")
CHUNKS = ("segment", "span")
CHOICES = {
    "plan": PLANS,
    "fusion": FUSIONS,
    "promotion": PROMOTIONS,
    "selection": SELECTIONS,
    "chunks": CHUNKS,
}


@dataclass(frozen=True)
class SelectiveOptions:
    boundary_k: int = 0  # first k tokens of every reused segment not at index 0 (EPIC)
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
        if not 0.0 <= self.ratio <= 1.0:
            raise ConfigError(f"ratio must be in [0, 1], got {self.ratio:g}")
        if not self.extra >= 0.0:
            raise ConfigError(f"extra must be >= 0, got {self.extra:g}")
        if self.per_chunk < 0:
            raise ConfigError(f"per_chunk must be >= 0, got {self.per_chunk}")
        budgets = sum(b > 0 for b in (self.ratio, self.extra, self.per_chunk))
        if budgets > 1:
            raise ConfigError("ratio, extra and per_chunk are alternative budgets: set one")
        if min(self.boundary_k, self.gate_every, self.probe_layers) < 0 or self.probe_window < 1:
            raise ConfigError(
                "boundary_k, gate_every, probe_layers must be >= 0, probe_window >= 1"
            )
        ranked = self.selection == "offset" or self.probe_layers or self.check_layer is not None
        if budgets and not ranked:
            raise ConfigError(
                "a budget (ratio, extra or per_chunk) needs a ranking to spend it: set "
                "selection=offset, probe_layers or check_layer"
            )
        if self.check_layer is not None and self.check_layer < 0:
            raise ConfigError(f"check_layer must be >= 0 or none, got {self.check_layer}")
        if self.probe_layers and self.check_layer is not None:
            raise ConfigError("probe_layers and check_layer are alternative selections: set one")


def qkv_fraction(c: ModelConfig) -> float:
    """Share of a layer's FLOPs spent in the Q/K/V projection (cost of a deviation check)."""
    qkv = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    layer = qkv + c.hidden_size * c.num_heads * c.head_dim + 3 * c.hidden_size * c.intermediate_size
    return qkv / layer


class SelectiveRecompute(ReuseStrategy):
    """Base of the position-independent strategies; subclasses set `defaults`."""

    defaults: ClassVar[SelectiveOptions] = SelectiveOptions()

    def __init__(self, **options: Any) -> None:
        known = {f.name for f in fields(SelectiveOptions)}
        if unknown := set(options) - known:
            raise ConfigError(
                f"{self.name}: unknown options {sorted(unknown)}; known: {sorted(known)}"
            )
        if ("ratio" in options or "per_chunk" in options) and "extra" not in options:
            options = {**options, "extra": 0.0}  # a budget given replaces a default `extra`
        self.options = replace(self.defaults, **options)
        self._starts: dict[str, Counter[int]] = {}  # CCPE histogram: segment -> start counts
        self._ccpe = CCPEPlan()

    @classmethod
    def option_types(cls) -> dict[str, OptionType]:
        return {f.name: OPTION_TYPES[str(f.type)] for f in fields(SelectiveOptions)}

    def prefill(self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV) -> PrefillResult:
        o = self.options
        stats = ReuseStats(prompt.num_tokens, ctx.model.config.num_layers)
        hits = find_hits(ctx, prompt, stats)
        if o.plan == "ccpe":
            hits = self._ccpe.filter(ctx.model.forward, ctx.model.model_id, prompt, hits, stats)
        positions = self._plan(prompt, hits)
        seq.extend(prompt.num_tokens)
        if not hits:  # nothing to reuse: `full`'s own prefill, no selection machinery
            logits = compute_subset(ctx, prompt, seq, torch.arange(prompt.num_tokens), stats)
            stats.close()
            return PrefillResult(logits, positions, stats)
        t0 = time.perf_counter()
        sel = select_up_front(o, prompt.num_tokens, reused_runs(prompt, hits, positions, o))
        loads = self._loads(seq, hits, positions)
        rope = ctx.model.forward.rope
        if ctx.decoupled_load and loads:
            kv: DirectKV = OverlayKV(seq, loads, rope, sel.reused)
        else:
            DirectKV.load_all(seq, loads, rope)
            kv = DirectKV(seq)
            stats.load_s = time.perf_counter() - t0
        stats.reused_tokens = int(sel.reused.sum())
        base, candidates, exact, budget = sel.base, sel.candidates, sel.exact, sel.budget
        run = _Run(ctx, prompt, seq, positions, stats, kv)
        logits = run.layers(base, candidates, exact, o, budget)
        stats.load_overlap = kv.finish()
        if isinstance(kv, OverlayKV):
            stats.load_s = kv.load_s
        for reason in kv.fallbacks:
            stats.fallback(reason)
        stats.recomputed_tokens = int(run.ever_computed.sum())
        stats.dirty = run.dirty & sel.reused
        stats.close()
        return PrefillResult(logits, positions, stats)

    def commit(
        self, ctx: ReuseContext, prompt: TokenizedPrompt, seq: SequenceKV, positions: Tensor
    ) -> None:
        commit_segments(ctx, prompt, seq, positions)

    def _plan(self, prompt: TokenizedPrompt, hits: list[SegmentHit]) -> Tensor:
        """Positions for every prompt token; records this turn's starts in the histogram."""
        positions = torch.arange(prompt.num_tokens)
        if self.options.plan == "mode":
            for h in hits:
                counts = self._starts.get(content_id(h.segment.ids, "segment", None))
                if counts:
                    start = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]
                    positions[h.start : h.end] = torch.arange(start, start + h.num_tokens)
        for seg in prompt.segments:
            if seg.kind in REUSABLE:
                key = content_id(seg.ids, "segment", None)
                self._starts.setdefault(key, Counter())[seg.start] += 1
        return positions

    @property
    def positional(self) -> bool:
        """Whether the tokens it computes are known before any layer runs (offset order, or
        no check layer and no probe; the prompt's own positions): `select_up_front` alone
        says which."""
        o = self.options
        ranked_later = o.check_layer is not None or o.probe_layers > 0
        return o.plan == "true" and (o.selection == "offset" or not ranked_later)

    def _loads(
        self, seq: SequenceKV, hits: list[SegmentHit], positions: Tensor
    ) -> list[PendingLoad]:
        """The cached K/V of every hit to load, re-rotated to `positions`."""
        slots = seq.slots()
        loads = []
        for h in hits:
            span = slice(h.start, h.end)
            old, new = h.kv.positions[: h.num_tokens], positions[span]
            keys, values = h.kv.keys[:, : h.num_tokens], h.kv.values[:, : h.num_tokens]
            loads.append(PendingLoad(slots[span], keys, values, old, new))
        return loads


@dataclass(frozen=True)
class ReusedRun:
    """A hit as the up-front selection sees it (no KV needed): where it sits, whether its KV is
    exact here, and whether it continues the hit before it (stored right after it, from one
    prompt: the two form one span for `chunks=span`)."""

    start: int
    num_tokens: int
    exact: bool = False
    joins_previous: bool = False

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


class StoredHit(Protocol):
    """What `reused_runs` reads of a hit: `SegmentHit`, or a plan made from store metadata."""

    @property
    def segment(self) -> TokenizedSegment: ...
    @property
    def start(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def stored_context(self) -> str | None: ...
    @property
    def stored_positions(self) -> Tensor | None: ...


def reused_runs(
    prompt: TokenizedPrompt, hits: Sequence[StoredHit], positions: Tensor, o: SelectiveOptions
) -> list[ReusedRun]:
    """Each hit's run: exact when `o.exact_prefix` and it was stored after this very context
    at these very positions."""
    contexts = dict(zip((s.start for s in prompt.segments), context_ids(prompt), strict=True))
    runs: list[ReusedRun] = []
    prev: StoredHit | None = None
    for h in hits:
        old, new = h.stored_positions, positions[h.start : h.start + h.num_tokens]
        exact = (
            o.exact_prefix
            and old is not None
            and h.stored_context == contexts[h.start]
            and bool(torch.equal(old[: h.num_tokens], new))
        )
        joins = (
            prev is not None
            and prev.num_tokens == len(prev.segment.ids)
            and prev.stored_context is not None
            and h.stored_context == chain_id(prev.stored_context, prev.segment.ids)
        )
        runs.append(ReusedRun(h.start, h.num_tokens, exact, joins))
        prev = h
    return runs


@dataclass(frozen=True)
class UpFrontSelection:
    """Token masks (T,) before any layer runs. `base` is computed through every layer; the
    ranking (check layer or probe) picks `budget` more among `candidates` (none when the
    order is by offset: those are in `base` already)."""

    reused: Tensor
    exact: Tensor
    base: Tensor
    candidates: Tensor
    budget: int


def select_up_front(
    o: SelectiveOptions, num_tokens: int, runs: list[ReusedRun]
) -> UpFrontSelection:
    """Update tokens, misses and the last token; boundary tokens; with offset order, the
    budget's tokens from each chunk's start."""
    reused = torch.zeros(num_tokens, dtype=torch.bool)
    exact = torch.zeros(num_tokens, dtype=torch.bool)
    for r in runs:
        reused[r.start : r.end] = True
        exact[r.start : r.end] = r.exact
    base = ~reused  # update tokens, missed segments and the last token
    for r in runs:
        if r.start > 0 and not r.exact:
            base[r.start : r.start + min(o.boundary_k, r.num_tokens)] = True
    candidates = reused & ~exact
    epic = epic_tokens(runs, candidates & ~base, o.per_chunk) if o.per_chunk else 0
    budget = _budget(o, int(candidates.sum()), int(base.sum()), epic)
    if o.selection == "offset":  # selected up front: the run computes them with the base
        spans = chunk_spans(runs, o.chunks == "span")
        base = base | by_offset(spans, candidates & ~base, budget)
        candidates = torch.zeros_like(candidates)
    return UpFrontSelection(reused, exact, base, candidates, budget)


class _Run:
    """One layer-by-layer selective prefill (see the module docstring for the map)."""

    def __init__(
        self,
        ctx: ReuseContext,
        prompt: TokenizedPrompt,
        seq: SequenceKV,
        positions: Tensor,
        stats: ReuseStats,
        kv: DirectKV,
    ) -> None:
        self.f = TimedForward(ctx.model.forward, stats)
        self.ids = torch.tensor(prompt.ids, dtype=torch.int64)
        self.seq = seq
        self.kv = kv  # every K/V write and read goes through it (decoupled or direct)
        self.slots = seq.slots()
        self.positions = positions
        self.stats = stats
        self.ever_computed = torch.zeros(prompt.num_tokens, dtype=torch.bool)
        self.dirty = torch.zeros(prompt.num_tokens, dtype=torch.bool)  # written at layer >= 1

    def layers(
        self, base: Tensor, candidates: Tensor, exact: Tensor, o: SelectiveOptions, budget: int
    ) -> Tensor:
        """`budget`: reused tokens to select beyond `base`, by `o.selection`."""
        num_layers = self.f.config.num_layers
        if o.probe_layers and bool(candidates.any()):
            return self._probed(base, candidates, o, budget)
        if o.check_layer is None or not bool(candidates.any()):
            q_idx = base.nonzero().flatten()
            hidden = self._through(self.f.embed(self.ids[q_idx]), q_idx, 0, num_layers)
            return self.f.logits(hidden[-1:])[0]
        # layers before the check: every token whose KV is not exact is computed fresh
        all_idx = (~exact).nonzero().flatten()
        hidden_all = self._through(self.f.embed(self.ids[all_idx]), all_idx, 0, o.check_layer)
        q, k, v = self.f.project(o.check_layer, hidden_all, self.positions[all_idx])
        self.stats.token_layers_computed += qkv_fraction(self.f.config) * len(all_idx)
        cached_k = self.kv.cached(o.check_layer, torch.arange(len(self.ids)))[0]
        attn = None
        if o.selection in ("attention", "weighted"):
            attn = self._attention_paid(base, all_idx, q, k, cached_k)
        selected, ranked = self._select(base, candidates, all_idx, k, cached_k, attn, o, budget)
        q_idx = (base | selected).nonzero().flatten()
        pick = torch.searchsorted(all_idx, q_idx)  # rows of q_idx within all_idx
        fused = selected[q_idx]
        self._write(o.check_layer, q_idx, k[pick], v[pick], fused, o)
        hidden = self._attend(o.check_layer, hidden_all[pick], q[pick], q_idx)
        self.stats.token_layers_computed += (1 - qkv_fraction(self.f.config)) * len(q_idx)
        gate = _Gate(o, ranked, selected, hidden_all, all_idx) if o.gate_every else None
        for layer in range(o.check_layer + 1, num_layers):
            q, k, v = self.f.project(layer, hidden, self.positions[q_idx])
            if gate is not None and layer % o.gate_every == 0:
                q_idx, hidden, q, k, v = gate.apply(self, layer, q_idx, hidden, q, k, v)
            self._write(layer, q_idx, k, v, gate.in_set(q_idx) if gate else selected[q_idx], o)
            hidden = self._attend(layer, hidden, q, q_idx)
            self.stats.token_layers_computed += len(q_idx)
        return self.f.logits(hidden[-1:])[0]

    def _probed(self, base: Tensor, candidates: Tensor, o: SelectiveOptions, budget: int) -> Tensor:
        """Probe-guided selection (the module map, with attention instead of deviation):

        layers [0, P)  : Q0 = base tokens computed over cached KV; the last W prompt tokens'
                         attention onto each reused token is summed over layers 1..P-1
        select         : S = the top `budget` candidates by that attention
        layers [0, P)  : S computed (its fresh K/V replace cached); with `probe_redo`, the
                         Q0 tokens after S's first token are computed again with S
        layers [P, L)  : Q0 + S computed

        When S would be every candidate, or (with `probe_redo`) leaving the rest out would
        save fewer token-layers than the redo costs, no probe runs: Q0 and every candidate go
        through all layers (`probe_shortcut`; exact)."""
        num_layers = self.f.config.num_layers
        probe = min(o.probe_layers, num_layers // 2)  # selected tokens need layers after it
        q_idx = base.nonzero().flatten()
        cand = (candidates & ~base).nonzero().flatten()
        budget = min(len(cand), budget)
        if o.probe_shortcut and _select_all(o, q_idx, cand, budget, probe, num_layers):
            # the probe could only rank tokens that are all (or almost all) computed anyway:
            # compute every candidate, exact, for no more token-layers than the probe path
            self.stats.probe_skipped = True
            idx = (base | candidates).nonzero().flatten()
            hidden = self._through(self.f.embed(self.ids[idx]), idx, 0, num_layers)
            return self.f.logits(hidden[-1:])[0]
        hidden = self.f.embed(self.ids[q_idx])
        score = torch.zeros(len(self.ids))
        window = q_idx[-o.probe_window :]
        for layer in range(probe):
            q, k, v = self.f.project(layer, hidden, self.positions[q_idx])
            self.kv.write(layer, q_idx, k, v)
            keys, values = self.kv.gather(layer)
            if layer >= 1:
                self.dirty[q_idx] = True
                score += self._attention_from(q[-len(window) :], window, keys)
            hidden = self.f.attend(layer, hidden, q, keys, values, q_idx)
            self.stats.token_layers_computed += len(q_idx)
        self.ever_computed[q_idx] = True
        if o.selection == "random":  # ablation: the same budget, tokens drawn at random
            score = torch.rand(len(self.ids), generator=torch.Generator().manual_seed(o.seed))
        s_idx = cand[score[cand].topk(budget).indices].sort().values
        if budget == 0:  # nothing to promote: finish the probe set
            return self.f.logits(self._through(hidden, q_idx, probe, num_layers)[-1:])[0]
        # probe states kept: all of Q0, or with probe_redo only Q0 up to S's first token
        keep = q_idx < s_idx[0] if o.probe_redo else torch.ones_like(q_idx, dtype=torch.bool)
        low = torch.cat([s_idx, q_idx[~keep]]).sort().values
        h_low = self._through(self.f.embed(self.ids[low]), low, 0, probe)
        merged = torch.cat([q_idx[keep], low])
        order = torch.argsort(merged)
        q_idx, hidden = merged[order], torch.cat([hidden[keep], h_low])[order]
        hidden = self._through(hidden, q_idx, probe, num_layers)
        return self.f.logits(hidden[-1:])[0]

    def _attention_from(self, q: Tensor, q_idx: Tensor, keys: Tensor) -> Tensor:
        """Attention the queries at `q_idx` pay each key: mean over heads, max over queries."""
        return attention_probs(q, q_idx, keys, self.f.scale).mean(dim=0).max(dim=0).values

    def _through(self, hidden: Tensor, idx: Tensor, first: int, last: int) -> Tensor:
        """Run tokens `idx` through layers [first, last), writing their fresh K/V."""
        for layer in range(first, last):
            q, k, v = self.f.project(layer, hidden, self.positions[idx])
            self.kv.write(layer, idx, k, v)
            hidden = self._attend(layer, hidden, q, idx)
            self.stats.token_layers_computed += len(idx)
        self.ever_computed[idx] = True
        if last > 1:
            self.dirty[idx] = True
        return hidden

    def _attention_paid(
        self, base: Tensor, all_idx: Tensor, q: Tensor, k_fresh: Tensor, cached_k: Tensor
    ) -> Tensor:
        """Mean attention (over heads and the always-computed queries) paid to each token at
        the check layer, with fresh keys where computed. (T,)"""
        keys = cached_k.clone()
        keys[all_idx] = k_fresh
        base_idx = base.nonzero().flatten()
        q_base = q[torch.searchsorted(all_idx, base_idx)]  # (B, H, Dh)
        return attention_probs(q_base, base_idx, keys, self.f.scale).mean(dim=(0, 1))

    def catch_up(self, hidden: Tensor, idx: Tensor, first: int, last: int) -> Tensor:
        """Bring promoted tokens' hidden states from layer `first` to `last`, leaving the
        (cached) K/V they have at those layers untouched."""
        for layer in range(first, last):
            q, _, _ = self.f.project(layer, hidden, self.positions[idx])
            hidden = self._attend(layer, hidden, q, idx)
            self.stats.token_layers_computed += len(idx)
        return hidden

    def _attend(self, layer: int, hidden: Tensor, q: Tensor, idx: Tensor) -> Tensor:
        keys, values = self.kv.gather(layer)
        return self.f.attend(layer, hidden, q, keys, values, idx)

    def _write(
        self, layer: int, idx: Tensor, k: Tensor, v: Tensor, fused: Tensor, o: SelectiveOptions
    ) -> None:
        """Fresh K/V of `idx` replace cached, except WCA-fused rows (mask `fused`)."""
        self.ever_computed[idx] = True
        if layer >= 1:
            self.dirty[idx] = True
        if o.fusion == "wca" and bool(fused.any()):
            ck, cv = self.kv.cached(layer, idx[fused])
            a = wca_weight(k[fused], ck)[:, None, None]
            k, v = k.clone(), v.clone()
            k[fused] = a * k[fused] + (1 - a) * ck
            v[fused] = a * v[fused] + (1 - a) * cv
        self.kv.write(layer, idx, k, v)

    def _select(
        self,
        base: Tensor,
        candidates: Tensor,
        all_idx: Tensor,
        k_fresh: Tensor,
        cached_k: Tensor,
        attn: Tensor | None,
        o: SelectiveOptions,
        budget: int,
    ) -> tuple[Tensor, Tensor]:
        """The top `budget` reused tokens by score. Returns (selected mask, ranked pool)."""
        cand = (candidates & ~base).nonzero().flatten()
        rows = torch.searchsorted(all_idx, cand)
        dev = (k_fresh[rows] - cached_k[cand]).pow(2).sum(dim=(1, 2))
        if attn is not None:
            dev = attn[cand] if o.selection == "attention" else dev * attn[cand]
        if o.selection == "random":
            g = torch.Generator().manual_seed(o.seed)
            dev = torch.rand(len(cand), generator=g)
        keep = dev > 0
        cand, dev = cand[keep], dev[keep]
        budget = min(len(cand), budget)
        order = torch.argsort(dev, descending=True)
        selected = torch.zeros_like(base)
        selected[cand[order[:budget]]] = True
        return selected, cand[order[budget:]]


def chunk_spans(runs: list[ReusedRun], merge: bool) -> list[tuple[int, int]]:
    """(start, end) of every reused chunk. With `merge`, a run joins the chunk before it when
    it follows that chunk's last run in this prompt and was stored right after it, from one
    prompt (`ReusedRun.joins_previous`): the KV in the span was computed together, so only
    the span's start saw a context that changed since."""
    spans: list[tuple[int, int]] = []
    for r in runs:
        if merge and spans and spans[-1][1] == r.start and r.joins_previous:
            spans[-1] = (spans[-1][0], r.end)
        else:
            spans.append((r.start, r.end))
    return spans


def epic_tokens(runs: list[ReusedRun], candidates: Tensor, k: int) -> int:
    """Candidates among the first k tokens of every run not at index 0: EPIC's token count."""
    return sum(
        int(candidates[r.start : r.start + min(k, r.num_tokens)].sum()) for r in runs if r.start > 0
    )


def by_offset(spans: list[tuple[int, int]], candidates: Tensor, budget: int) -> Tensor:
    """`budget` candidates in order of their offset within their chunk (every chunk's first
    candidate, then every chunk's second, ...; earlier chunks first at equal offset). (T,)"""
    offset = torch.full(candidates.shape, -1, dtype=torch.int64)
    for start, end in spans:
        offset[start:end] = torch.arange(end - start)
    idx = (candidates & (offset >= 0)).nonzero().flatten()
    order = torch.argsort(offset[idx] * (len(candidates) + 1) + idx)[:budget]
    chosen = torch.zeros_like(candidates)
    chosen[idx[order]] = True
    return chosen


def _select_all(
    o: SelectiveOptions, q_idx: Tensor, cand: Tensor, budget: int, probe: int, num_layers: int
) -> bool:
    """Whether computing every candidate costs no more token-layers than the probe path.

    The probe path computes the base and `budget` candidates through every layer, plus, with
    `probe_redo`, the probe layers again for the base tokens after the first selected one;
    at the least, those after `cand[n - budget]` (the latest the first selected can be).
    Computing all instead adds the `n - budget` unselected candidates through every layer."""
    n = len(cand)
    if n == 0:
        return False
    if budget >= n:
        return True
    if not o.probe_redo or budget == 0:
        return False
    redo_min = int((q_idx > cand[n - budget]).sum())
    return (n - budget) * num_layers <= redo_min * probe


def _budget(o: SelectiveOptions, reused: int, computed: int, epic: int) -> int:
    """Tokens to select: `extra` per always-computed token when set, EPIC's count (`epic`)
    with `per_chunk`, else `ratio` of reused."""
    if o.extra > 0:
        return math.ceil(o.extra * computed)
    if o.per_chunk > 0:
        return epic
    return math.ceil(o.ratio * reused)


def attention_probs(q: Tensor, q_idx: Tensor, keys: Tensor, scale: float) -> Tensor:
    """Causal attention probabilities of queries (W, H, Dh) at prompt indices `q_idx` (W,)
    over keys (T, Hkv, Dh). -> (H, W, T)

    One batched matmul per KV head with the causal mask folded in as its additive term: no
    copy of the keys per query head and no separate masking pass (the probe scores up to
    256 queries against every prompt key on each probe layer, so this is on the TTFT path).
    `attention_probs_reference` is the plain formulation it is tested against."""
    w, h, d = q.shape
    t, hkv = keys.shape[0], keys.shape[1]
    group = h // hkv
    q_g = q.reshape(w, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * w, d)
    bias = torch.zeros(w, t, dtype=q.dtype)
    bias.masked_fill_(torch.arange(t)[None, :] > q_idx[:, None], float("-inf"))
    scores = torch.baddbmm(
        bias.repeat(group, 1).expand(hkv, group * w, t), q_g, keys.permute(1, 2, 0), alpha=scale
    )
    return torch.softmax(scores, dim=-1).reshape(h, w, t)


def attention_probs_reference(q: Tensor, q_idx: Tensor, keys: Tensor, scale: float) -> Tensor:
    """`attention_probs` written plainly: GQA groups expanded, scores masked, softmax."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)  # (T, H, Dh)
    scores = torch.einsum("whd,thd->hwt", q, k) * scale
    mask = torch.arange(keys.shape[0])[None, :] <= q_idx[:, None]  # (W, T)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def wca_weight(k_fresh: Tensor, k_cached: Tensor) -> Tensor:
    """a_i = ||K_fresh - K_cached||^2 / ||K_cached||^2, clamped to [0, 1]. (n, H, D) -> (n,)"""
    num = (k_fresh - k_cached).pow(2).sum(dim=(1, 2))
    den = k_cached.pow(2).sum(dim=(1, 2)).clamp_min(1e-12)
    return (num / den).clamp(0.0, 1.0)


def cksim(k_fresh: Tensor, k_cached: Tensor) -> Tensor:
    """Mean over heads of the cosine between fresh and cached keys. (n, H, D) -> (n,)"""
    return torch.nn.functional.cosine_similarity(k_fresh, k_cached, dim=-1).mean(dim=-1)


class _Gate:
    """WCA's gating: every `gate_every` layers converged selected tokens leave the set;
    with promotion "catch-up" the next-ranked tokens join, computed up from the check layer."""

    def __init__(
        self,
        o: SelectiveOptions,
        ranked: Tensor,
        selected: Tensor,
        hidden_check: Tensor,
        all_idx: Tensor,
    ) -> None:
        self.o = o
        self.waiting = list(ranked.tolist())  # deviation order, best first
        self.selected = selected.clone()
        self.hidden_check = hidden_check  # hidden states entering the check layer, rows all_idx
        self.all_idx = all_idx
        self.removed = 0
        self.promoted = 0

    def in_set(self, q_idx: Tensor) -> Tensor:
        return self.selected[q_idx]

    def apply(
        self, run: _Run, layer: int, q_idx: Tensor, hidden: Tensor, q: Tensor, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        cached_k = run.kv.cached(layer, q_idx)[0]
        sel = self.selected[q_idx]
        converged = sel & (1 - cksim(k, cached_k) < self.o.tau)
        keep = ~converged
        self.selected[q_idx[converged]] = False
        self.removed += int(converged.sum())
        q_idx, hidden, q, k, v = q_idx[keep], hidden[keep], q[keep], k[keep], v[keep]
        n_new = int(converged.sum()) if self.o.promotion == "catch-up" else 0
        if n_new and self.waiting:
            new_idx = torch.tensor(sorted(self.waiting[:n_new]), dtype=torch.int64)
            self.waiting = self.waiting[n_new:]
            rows = torch.searchsorted(self.all_idx, new_idx)
            h_new = run.catch_up(self.hidden_check[rows], new_idx, self.o.check_layer or 0, layer)
            q_new, k_new, v_new = run.f.project(layer, h_new, run.positions[new_idx])
            self.selected[new_idx] = True
            self.promoted += len(new_idx)
            order = torch.argsort(torch.cat([q_idx, new_idx]))
            q_idx = torch.cat([q_idx, new_idx])[order]
            hidden = torch.cat([hidden, h_new])[order]
            q, k, v = (torch.cat(p)[order] for p in ((q, q_new), (k, k_new), (v, v_new)))
        return q_idx, hidden, q, k, v
