"""What one turn gave: `Generation`, and what it did: `TurnStats`, built from its parts (prefill,
decode, the reply's KV).

`TurnStats` keeps one flat set of fields, which the session, the server, the benchmarks and
their JSON read; the engine builds it with `TurnStats.of` from the typed parts. Each field is
declared once: `PromptTotals` (shared with the server's `ReuseReport`) and `PrefillFields` for
the prompt's side, `DecodePart` for the reply's; `TurnStats` takes both sides' fields, all by
keyword.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from agentcache.decode.stats import DecodeStats
from agentcache.reuse.base import ReuseStats, SegmentMiss
from agentcache.reuse.planner.stats import PlannedStats, PlanReport


class ReplyKV(StrEnum):
    """Whether `Engine.generate(reply=...)` stored the reply's KV under next turn's form of it,
    or why not. The values are what JSON and reports show."""

    STORED = "stored"
    NO_REPLY = "no-reply"
    SPARSE_DECODE = "sparse-decode"
    NO_GENERATION_PROMPT = "no-generation-prompt"
    RETOKENIZED = "retokenized"
    CONTEXT = "context"
    BACKEND = "backend"
    NO_ROOM = "no-room"

    @property
    def reason(self) -> str:
        return _REASONS[self]


_REASONS = {
    ReplyKV.STORED: "the closed message's KV is in the store",
    ReplyKV.NO_REPLY: "the caller gave no segment for this reply",
    ReplyKV.SPARSE_DECODE: "a sparse decoder held the KV; the engine's pages were released",
    ReplyKV.NO_GENERATION_PROMPT: "the prompt did not end in an open assistant message",
    ReplyKV.RETOKENIZED: "the reply's message tokenizes differently from the generated tokens",
    ReplyKV.CONTEXT: "the closed message would pass the model's positions",
    ReplyKV.BACKEND: "this execution backend does not store replies (vLLM)",
    ReplyKV.NO_ROOM: "the fast tier had no page left for the message's closing tokens",
}


class TokenUse(StrEnum):
    """Where a prompt token's KV came from. `exact`, `moved` and `refreshed` were found in the
    store (`reused_tokens`); `computed` were not (new, changed, evicted text, and the last
    prompt token, which always is)."""

    EXACT = "exact"  # stored after this very context, at these positions: as computed
    MOVED = "moved"  # stored behind another context or at other positions: re-rotated, kept
    REFRESHED = "refreshed"  # found, then recomputed (at layer >= 1) for fidelity
    COMPUTED = "computed"


@dataclass(frozen=True)
class TokenReuse:
    """Each prompt token's `TokenUse`, as runs `(start, end, use)` tiling [0, prompt_tokens).

    tokens : [ system ][ memory (changed) ][ history ......... ][ user ][gen]
    runs   :  exact     computed             moved  refr  moved  computed
    """

    runs: tuple[tuple[int, int, TokenUse], ...]

    @classmethod
    def of(
        cls, num_tokens: int, reused: Tensor | None, exact: Tensor | None, dirty: Tensor | None
    ) -> TokenReuse:
        """From a prefill's (T,) masks (`ReuseStats.reused`, `.exact`, `.dirty`)."""
        order = list(TokenUse)  # codes: indices into it
        codes = torch.full((num_tokens,), order.index(TokenUse.COMPUTED), dtype=torch.int8)
        if reused is not None:
            codes[reused] = order.index(TokenUse.MOVED)
            if exact is not None:
                codes[reused & exact] = order.index(TokenUse.EXACT)
            if dirty is not None:
                codes[reused & dirty] = order.index(TokenUse.REFRESHED)
        cuts = [0, *((codes[1:] != codes[:-1]).nonzero().flatten() + 1).tolist(), num_tokens]
        return cls(tuple(
            (s, e, order[int(codes[s])]) for s, e in itertools.pairwise(cuts) if e > s
        ))  # fmt: skip

    def count(self, use: TokenUse, start: int = 0, end: int | None = None) -> int:
        """Tokens of `use` within [start, end) (default: the whole prompt)."""
        stop = end if end is not None else (self.runs[-1][1] if self.runs else 0)
        return sum(max(0, min(e, stop) - max(s, start)) for s, e, u in self.runs if u == use)


@dataclass(frozen=True, kw_only=True)
class PromptTotals:
    """What a turn's prompt reused and computed under `strategy`, and the time to the first
    token's logits: the figures a turn's `TurnStats` and the server's `ReuseReport` both give.

    `reused_tokens` were found in the store (the refreshed ones among them recomputed, and not
    loaded where the plan computes every changed-context token); `recomputed_tokens` went
    through the model at some layer. They overlap: a found token recomputed for fidelity is in
    both. The split that adds up is `exact + moved + refreshed + computed == prompt_tokens`
    (`TokenUse`), with `exact + moved + refreshed == reused_tokens`; None where the engine
    cannot tell (the vLLM backend)."""

    strategy: str
    prompt_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    recompute_fraction: float
    ttft_s: float
    fallbacks: int
    fallback_reasons: tuple[str, ...]
    exact_tokens: int | None = None
    moved_tokens: int | None = None
    refreshed_tokens: int | None = None
    computed_tokens: int | None = None

    def __post_init__(self) -> None:
        split = (self.exact_tokens, self.moved_tokens, self.refreshed_tokens, self.computed_tokens)
        if all(n is None for n in split):
            return
        if any(n is None for n in split) or sum(n or 0 for n in split) != self.prompt_tokens:
            raise ValueError(f"token split {split} does not add up to {self.prompt_tokens}")
        if sum(n or 0 for n in split[:3]) != self.reused_tokens:
            raise ValueError(f"token split {split} does not add up to {self.reused_tokens} reused")


@dataclass(frozen=True, kw_only=True)
class PrefillFields(PromptTotals):
    """The prompt's side of a turn: its totals, the segments the strategy missed, and how the
    load went. Declared once for `PrefillPart` and `TurnStats`."""

    misses: tuple[SegmentMiss, ...]
    token_reuse: TokenReuse | None = None  # per token; None where the engine cannot tell
    load_overlap: float | None = None  # share of the KV load hidden behind compute
    probe_skipped: bool = False  # a probe strategy computed every candidate (ReuseStats)
    epic_turn: bool = False  # `epic_over` computed chunk starts instead of ranking (ReuseStats)
    # the work counted, not timed: calls into the model, tokens whose cached K/V was loaded
    model_calls: int = 0
    loaded_tokens: int = 0
    exact_plan: bool = False  # a selective plan computed every reused token whose context changed
    # reused tokens loaded from a context copy (reuse/segments.py): an earlier turn's KV in
    # this very context, used as it is; not counted exact (not full recompute's KV)
    context_copy_tokens: int = 0
    # the cost guard (reuse/guard.py): the plan's predicted cost and full recompute's, in
    # token-layers of dense compute (None: no plan beside full's), and whether the plan was
    # not taken because it cost more (then `full`'s prefill ran)
    plan_cost: float | None = None
    full_cost: float | None = None
    guarded: bool = False
    # the `plan` strategy's choice: the plan run, its predicted cost and fidelity, every plan
    # it weighed, and why the predictor could not run (None for other strategies)
    plan: PlanReport | None = None


@dataclass(frozen=True, kw_only=True)
class PrefillPart(PrefillFields):
    """The prompt's side of one turn, as the engine builds it from a strategy's `ReuseStats`."""

    @classmethod
    def of(cls, strategy: str, stats: ReuseStats, ttft_s: float) -> PrefillPart:
        s = stats
        uses: TokenReuse | None = TokenReuse.of(s.prompt_tokens, s.reused, s.exact, s.dirty)
        if s.reused is None and s.reused_tokens > 0:  # a strategy that keeps no masks
            uses = None
        split = {} if uses is None else {
            f"{u.value}_tokens": uses.count(u) for u in TokenUse
        }  # fmt: skip
        return cls(
            strategy=strategy, prompt_tokens=s.prompt_tokens, reused_tokens=s.reused_tokens,
            recomputed_tokens=s.recomputed_tokens, recompute_fraction=s.recompute_fraction,
            ttft_s=ttft_s, fallbacks=s.fallbacks, fallback_reasons=tuple(s.fallback_reasons),
            misses=tuple(s.misses), token_reuse=uses, load_overlap=s.load_overlap,
            probe_skipped=s.probe_skipped, epic_turn=s.epic_turn, **split,
            model_calls=s.model_calls, loaded_tokens=s.loaded_tokens, exact_plan=s.exact_plan,
            context_copy_tokens=s.context_copy_tokens,
            plan_cost=None if s.guard is None else s.guard.plan_units,
            full_cost=None if s.guard is None else s.guard.full_units, guarded=s.guarded,
            plan=s.plan if isinstance(s, PlannedStats) else None,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DecodePart:
    """The reply's side: tokens, their rate, and the decode policy that produced them."""

    decode_tokens: int
    decode_tokens_per_s: float
    decode_policy: str = "dense"
    decode_fallbacks: int = 0  # 1 when the configured decode policy fell back to dense
    decode_fallback_reason: str | None = None  # why (a profile error, a turn too short)
    # the fallback's kind: "short" (a turn its sparse budget covers whole), "profile" (no
    # usable head profile, under dense_fallback); None when the configured policy ran
    decode_fallback_kind: str | None = None
    decode: DecodeStats | None = None  # sparse decode figures (None for dense)


@dataclass(frozen=True, kw_only=True)
class TurnStats(PrefillFields, DecodePart):
    """A turn's figures, flat: the fields of both parts, and what became of the reply's KV."""

    # the reply's KV stored for the next turn, or why not (a string value is converted)
    reply_kv: ReplyKV | None = None
    # full prompt pages the turn held in common with running turns (the same K/V, bit for
    # bit; EngineConfig.share_pages) instead of its own, from the end of its prefill
    shared_pages: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reply_kv is not None:
            object.__setattr__(self, "reply_kv", ReplyKV(self.reply_kv))

    @classmethod
    def of(
        cls, *, prefill: PrefillPart, decode: DecodePart, reply_kv: ReplyKV | None = None,
        shared_pages: int = 0,
    ) -> TurnStats:  # fmt: skip
        return cls(**_shallow(prefill), **_shallow(decode), reply_kv=reply_kv,
                   shared_pages=shared_pages)  # fmt: skip


def _shallow(part: PrefillPart | DecodePart) -> dict[str, Any]:
    """A part's fields by name, values as they are (`dataclasses.asdict` would copy them)."""
    return {f.name: getattr(part, f.name) for f in fields(part)}


@dataclass(frozen=True)
class Generation:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length"
    first_token_logits: Tensor  # (V,)
    stats: TurnStats
