"""Why-no-hit: per response, what was reused and, per segment, how or why not.

Each prompt segment gets one status:
- `hit`: found in the store, its KV exact here (stored after this very context, at these
  positions);
- `moved`: found, but computed behind another context or at other positions: re-rotated to
  where it sits now, some of its tokens perhaps recomputed for fidelity (`refreshed_tokens`);
- `changed`: not in the store, and the previous request of its conversation (or of its
  `prompt_cache_key` group) had another message at this index; `reason` is the store's;
  `exact_tokens` counts its opening reused from a stored segment that begins alike, after
  this very context (reuse/segments.py "Heads"), as for `new`;
- `new`: not in the store (`reason`: `new`, never stored; `other-model`, stored by another
  model or tokenizer; `checksum`, a stored copy failed its check);
- `evicted`: stored once, dropped for space (`reason` `evicted` too);
- `computed`: computed by design (`reason`: `generation-prompt`, `prefill`), or found but
  not used by the strategy (`reason`: `not-used`);
- `not-looked-up`: `full` reuses nothing; `prefix` reuses whole 16-token blocks of the exact
  prefix, so its segments read `hit` as far as those go and `not-looked-up` after.

Everything here is the requesting tenant's: the store is keyed by content within the tenant
(or conversation) scope, so no other tenant's entry can be found, missed or evicted for it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from agentcache.chat.segmenter import ChatPrompt, MessagePlan
from agentcache.kv.store import MissReason
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.tokenize import GENERATION_PROMPT_ID, TokenizedPrompt, TokenizedSegment
from agentcache.runtime.engine import TurnStats
from agentcache.runtime.stats import PromptTotals, TokenUse

# strategies that reuse no segment-keyed KV, so record no per-segment lookups
NO_SEGMENT_LOOKUP = frozenset({"full", "prefix"})
FOUND = (TokenUse.EXACT, TokenUse.MOVED, TokenUse.REFRESHED)
MISSED = ("changed", "new", "evicted")


@dataclass(frozen=True)
class SegmentReport:
    segment_id: str
    message_index: int | None
    role: str | None
    kind: str
    num_tokens: int
    status: str  # hit | moved | changed | new | evicted | computed | not-looked-up
    reason: str | None  # the store's miss reason, or why the segment was computed
    # its found tokens, split as `TokenUse` (all 0 when nothing was found; None: unknown)
    exact_tokens: int | None = 0
    moved_tokens: int | None = 0
    refreshed_tokens: int | None = 0


@dataclass(frozen=True, kw_only=True)
class ReuseReport(PromptTotals):
    """A response's totals (`PromptTotals`: the split of the prompt's tokens adds up) and its
    segments."""

    conversation_id: str
    segments: tuple[SegmentReport, ...]

    @property
    def misses(self) -> tuple[SegmentReport, ...]:
        """Segments looked up and not found (their `reason` is the store's)."""
        return tuple(s for s in self.segments if s.status in MISSED)

    @property
    def reused_fraction(self) -> float:
        return self.reused_tokens / max(1, self.prompt_tokens)

    def why_no_hit(self) -> list[str]:
        """One line per segment that was not an exact hit, e.g. `msg-3f.. (user #4, 37 tokens):
        evicted`."""
        lines = []
        for s in self.segments:
            if s.status == "hit":
                continue
            where = f"{s.role} #{s.message_index}" if s.message_index is not None else s.role
            why = f": {s.reason}" if s.reason and s.reason != s.status else ""
            lines.append(f"{s.segment_id} ({where}, {s.num_tokens} tokens): {s.status}{why}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        # the keys in the order clients have always had them: strategy, conversation, totals
        d = {"strategy": self.strategy, "conversation_id": self.conversation_id, **asdict(self)}
        d["reused_fraction"] = round(self.reused_fraction, 4)
        d["fallback_reasons"] = list(self.fallback_reasons)
        d["segments"] = [asdict(s) for s in self.segments]
        return d


def build_report(chat: ChatPrompt, tokens: TokenizedPrompt, stats: TurnStats) -> ReuseReport:
    plans = {p.segment_id: p for p in chat.plan}
    misses = {m.segment_id: m.reason for m in stats.misses}
    segments = tuple(_segment(ts, plans.get(ts.segment.id or ""), stats, misses)
                     for ts in tokens.segments)  # fmt: skip
    totals: dict[str, Any] = {f.name: getattr(stats, f.name) for f in fields(PromptTotals)}
    return ReuseReport(**totals, conversation_id=chat.conversation_id, segments=segments)


def _segment(
    ts: TokenizedSegment, plan: MessagePlan | None, stats: TurnStats,
    misses: dict[str | None, MissReason],
) -> SegmentReport:  # fmt: skip
    seg = ts.segment
    found: dict[TokenUse, int | None] = dict.fromkeys(FOUND, 0)
    if stats.token_reuse is not None:
        found = {u: stats.token_reuse.count(u, ts.start, ts.end) for u in FOUND}
    status, reason = _status(ts, plan, stats, misses, found)
    index = plan.message_index if plan else None
    return SegmentReport(
        seg.id or "", index, seg.role, str(seg.kind), len(ts.ids), status, reason,
        found[TokenUse.EXACT], found[TokenUse.MOVED], found[TokenUse.REFRESHED],
    )  # fmt: skip


def _status(
    ts: TokenizedSegment, plan: MessagePlan | None, stats: TurnStats,
    misses: dict[str | None, MissReason], found: dict[TokenUse, int | None],
) -> tuple[str, str | None]:  # fmt: skip
    seg = ts.segment
    if seg.kind == SegmentKind.UPDATE:
        if plan is None:  # added by the tokenizer, not the segmenter
            return "computed", "generation-prompt" if seg.id == GENERATION_PROMPT_ID else "update"
        return "computed", plan.source
    n_found = sum(n or 0 for n in found.values())
    if n_found > 0 and seg.id not in misses:
        return ("hit" if found[TokenUse.EXACT] == n_found else "moved"), None
    if stats.strategy in NO_SEGMENT_LOOKUP:
        return "not-looked-up", f"strategy {stats.strategy} reuses no segments"
    if seg.id in misses:  # its text was not found (its opening may have been: `exact_tokens`)
        reason = misses[seg.id]
        if reason == MissReason.EVICTED:
            return "evicted", str(reason)
        return ("changed" if plan is not None and plan.changed else "new"), str(reason)
    if stats.token_reuse is None:  # found; how it was used is not known (vLLM)
        return "hit", None
    return "computed", "not-used"
