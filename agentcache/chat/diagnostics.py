"""Why-no-hit: per response, what was reused and, per segment, why it was not.

Each prompt segment gets one status:
- `hit`: a system/fixed segment found in the store (the strategy reused its KV, possibly
  recomputing some of its tokens, counted in `recomputed_tokens`);
- `miss`: a system/fixed segment not found, with the store's reason: `new` (never stored),
  `evicted` (dropped for space), `other-model` (stored by another model or tokenizer),
  `checksum` (a stored copy failed its check and was not served);
- `computed`: an update segment, computed by design, with why it was an update: `new` or
  `changed` message, `prefill`, `generation-prompt`;
- `not-looked-up`: the strategy does not look segments up (`full` reuses nothing, `prefix`
  reuses whole 16-token blocks of the exact prefix); the totals still say what was reused.

The report speaks of the conversation's own traffic only: a shared segment (system message,
tools block) that the conversation sends for the first time is `computed`/`new` whether or not
another conversation's copy of it was found and reused, and its tokens count as computed, not
reused (`cached_tokens` too). On such a turn the totals are what the conversation can know:
`recomputed_tokens` is every token not reported reused, and the strategy's fallbacks are left
out (the server's metrics still count them), since both depend on what was found. Under
`prefix`, whose blocks are keyed by their tokens alone, the reuse reported stops where the
conversation's own earlier segments end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from agentcache.chat.segmenter import ChatPrompt
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.tokenize import GENERATION_PROMPT_ID, TokenizedPrompt, TokenizedSegment
from agentcache.reuse.segments import reusable_tokens
from agentcache.runtime.engine import TurnStats
from agentcache.runtime.stats import PromptTotals

# strategies that reuse no segment-keyed KV, so record no per-segment lookups
PREFIX = "prefix"
NO_SEGMENT_LOOKUP = frozenset({"full", PREFIX})


@dataclass(frozen=True)
class SegmentReport:
    segment_id: str
    message_index: int | None
    role: str | None
    kind: str
    num_tokens: int
    status: str  # hit | miss | computed | not-looked-up
    reason: str | None  # miss reason, or why the segment was an update


@dataclass(frozen=True, kw_only=True)
class ReuseReport(PromptTotals):
    """A response's totals, as the conversation knows them (see above), and its segments."""

    conversation_id: str
    segments: tuple[SegmentReport, ...]

    @property
    def misses(self) -> tuple[SegmentReport, ...]:
        return tuple(s for s in self.segments if s.status == "miss")

    @property
    def reused_fraction(self) -> float:
        return self.reused_tokens / max(1, self.prompt_tokens)

    def why_no_hit(self) -> list[str]:
        """One line per segment that was not reused, e.g. `msg-3f.. (user #4, 37 tokens):
        miss: evicted`."""
        lines = []
        for s in self.segments:
            if s.status == "hit":
                continue
            where = f"{s.role} #{s.message_index}" if s.message_index is not None else s.role
            lines.append(f"{s.segment_id} ({where}, {s.num_tokens} tokens): {s.status}: {s.reason}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        # the keys in the order clients have always had them: strategy, conversation, totals
        d = {"strategy": self.strategy, "conversation_id": self.conversation_id, **asdict(self)}
        d["reused_fraction"] = round(self.reused_fraction, 4)
        d["fallback_reasons"] = list(self.fallback_reasons)
        d["segments"] = [asdict(s) for s in self.segments]
        return d


def build_report(chat: ChatPrompt, tokens: TokenizedPrompt, stats: TurnStats) -> ReuseReport:
    segments = tuple(_segment_report(chat, ts, stats) for ts in tokens.segments)
    if stats.strategy == PREFIX:  # its blocks are keyed by tokens alone, whoever sent them
        reused = min(stats.reused_tokens, _own_prefix(chat, tokens))
    else:  # only the conversation's own: what it would reuse had no one else sent anything
        hits = {s.segment_id for s in segments if s.status == "hit"}
        reused = sum(reusable_tokens(tokens, ts) for ts in tokens.segments if ts.segment.id in hits)
    totals: dict[str, Any] = {f.name: getattr(stats, f.name) for f in fields(PromptTotals)}
    report = ReuseReport(**totals, conversation_id=chat.conversation_id, segments=segments)
    if reused == stats.reused_tokens and not chat.first_sent:
        return report
    computed = stats.prompt_tokens - reused
    return replace(
        report, reused_tokens=reused, recomputed_tokens=computed,
        recompute_fraction=computed / max(1, stats.prompt_tokens), fallbacks=0, fallback_reasons=(),
    )  # fmt: skip


def _own_prefix(chat: ChatPrompt, tokens: TokenizedPrompt) -> int:
    """Tokens of the prompt's longest prefix of segments the conversation sent before."""
    n = 0
    for ts in tokens.segments:
        if ts.kind == SegmentKind.UPDATE or ts.segment.id in chat.first_sent:
            break
        n += len(ts.ids)
    return n


def _segment_report(chat: ChatPrompt, ts: TokenizedSegment, stats: TurnStats) -> SegmentReport:
    seg = ts.segment
    plan = next((p for p in chat.plan if p.segment_id == seg.id), None)
    missed = {m.segment_id: m for m in stats.misses}
    if seg.kind == SegmentKind.UPDATE:
        status = "computed"
        reason = plan.status if plan else (
            "generation-prompt" if seg.id == GENERATION_PROMPT_ID else "update"
        )  # fmt: skip
    elif seg.id in chat.first_sent:
        status, reason = "computed", "new"
    elif stats.strategy in NO_SEGMENT_LOOKUP:
        status, reason = "not-looked-up", f"strategy {stats.strategy} reuses no segments"
    elif seg.id in missed:
        status, reason = "miss", str(missed[seg.id].reason)
    else:
        status, reason = "hit", None
    index = plan.message_index if plan else None
    return SegmentReport(seg.id or "", index, seg.role, str(seg.kind), len(ts.ids), status, reason)
