"""What the connector claims for a request, decided without vLLM (pure, unit-tested).

Two modes, chosen per request:

- **prefix** (any request): the prompt is cut into vLLM blocks; block i's content id chains
  the ids of every block before it (`chain_id`), so a hit means the whole prefix up to it is
  identical. The claim is the longest run of stored blocks, ending before the last prompt
  token (vLLM always computes at least one token). Loaded KV is exact: vLLM's own.
- **segments** (requests that carry agentcache segment spans): if any reusable segment
  (system / fixed) after the tokens vLLM already has is in the store, the connector claims
  every token from there up to the last prompt token, and fills the span by running an
  agentcache reuse strategy (see `transfer.SegmentFiller`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentcache.errors import PromptError
from agentcache.kv.store import chain_id, content_id
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.segments import REUSABLE

PARAMS_KEY = "agentcache"  # key in SamplingParams.extra_args["kv_transfer_params"]
PREFIX_NAMESPACE = "vllm-prefix"
SEGMENT_NAMESPACE = "segment"  # the namespace agentcache's own engine stores segments under


@dataclass(frozen=True)
class SegmentSpan:
    kind: SegmentKind
    start: int
    end: int
    id: str | None = None
    scope: str | None = None  # `Segment.scope`: keyed in its own namespace, private to it

    def content_id(self, token_ids: Sequence[int]) -> str:
        """The segment's store key, as agentcache's engine keys it (scope included)."""
        return segment_content_id(token_ids[self.start : self.end], self.scope)


@dataclass(frozen=True)
class RequestSpec:
    """What a request asks of the connector: segment spans and a strategy, or nothing.

    A request of a staged prefill (`stages.py`) carries `stage`, the run of stored KV it may
    claim, instead of a strategy; only the last stage of a prompt stores (`save`).
    `min_reused` overrides the connector's `min_reused_fraction` for this request (the backend
    sets 0 when it has measured that the engine fill is the faster)."""

    spans: tuple[SegmentSpan, ...] = ()
    strategy: str | None = None
    report: str | None = None  # name of the worker's report file for this request
    stage: tuple[int, int] | None = None
    save: bool = True
    min_reused: float | None = None

    def with_report(self, report: str) -> RequestSpec:
        return replace(self, report=report)

    @property
    def mode(self) -> str:
        if not self.spans:
            return "prefix"
        return "segments" if self.stage is None else "staged"

    def to_params(self) -> dict[str, Any]:
        spans = [[s.kind.value, s.start, s.end, s.id, s.scope] for s in self.spans]
        body: dict[str, Any] = {"segments": spans, "strategy": self.strategy}
        body |= {"report": self.report, "save": self.save}
        if self.stage is not None:
            body["stage"] = list(self.stage)
        if self.min_reused is not None:
            body["min_reused"] = self.min_reused
        return {PARAMS_KEY: body}

    @classmethod
    def from_prompt(cls, prompt: TokenizedPrompt, strategy: str | None) -> RequestSpec:
        spans = tuple(
            SegmentSpan(s.kind, s.start, s.end, s.segment.id, s.segment.scope)
            for s in prompt.segments
        )
        return cls(spans, strategy)

    @classmethod
    def parse(cls, params: dict[str, Any] | None, num_tokens: int) -> RequestSpec:
        """Read a request's kv_transfer_params; bad spans are a `PromptError`."""
        body = (params or {}).get(PARAMS_KEY)
        if not body:
            return cls()
        raw = body.get("segments") or []
        spans, expect = [], 0
        for item in raw:
            if not isinstance(item, list | tuple) or len(item) not in (4, 5):
                raise PromptError(f"segment span {item!r} is not [kind, start, end, id, scope]")
            kind, start, end, sid, *rest = item
            scope = rest[0] if rest else None
            if start != expect or end <= start:
                raise PromptError(
                    f"segment spans must tile the prompt in order: got [{start}, {end}) "
                    f"after token {expect}"
                )
            span = SegmentSpan(SegmentKind.parse(str(kind)), int(start), int(end), sid, scope)
            spans.append(span)
            expect = end
        if spans and expect != num_tokens:
            raise PromptError(f"segment spans cover {expect} tokens, the prompt has {num_tokens}")
        strategy, report = body.get("strategy"), body.get("report")
        if report is not None and not str(report).isalnum():
            raise PromptError(f"report name {report!r} must be alphanumeric")
        stage = _stage(body.get("stage"), num_tokens) if spans else None
        save = body.get("save", True)
        if not isinstance(save, bool):
            raise PromptError(f"save must be true or false, got {save!r}")
        min_reused = body.get("min_reused")
        if min_reused is not None and (
            isinstance(min_reused, bool)
            or not isinstance(min_reused, int | float)
            or not 0 <= min_reused <= 1
        ):
            raise PromptError(f"min_reused must be a number in [0, 1], got {min_reused!r}")
        return cls(
            tuple(spans), str(strategy) if strategy else None, report and str(report), stage,
            save, None if min_reused is None else float(min_reused),
        )  # fmt: skip

    def clipped(self, num_tokens: int) -> RequestSpec:
        """The spans of the prompt's first `num_tokens` tokens (the last one cut there)."""
        spans = tuple(
            replace(s, end=min(s.end, num_tokens)) for s in self.spans if s.start < num_tokens
        )
        return replace(self, spans=spans)

    def tokenized(self, token_ids: Sequence[int]) -> TokenizedPrompt:
        """The prompt as agentcache's engine sees it (texts are not needed for reuse)."""
        segs = tuple(
            TokenizedSegment(
                Segment(s.kind, "", s.id, scope=s.scope), tuple(token_ids[s.start : s.end]), s.start
            )
            for s in self.spans
        )
        return TokenizedPrompt(segs, tuple(token_ids))


def _stage(raw: Any, num_tokens: int) -> tuple[int, int] | None:
    if raw is None:
        return None
    ok = isinstance(raw, list | tuple) and len(raw) == 2
    if not ok or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        raise PromptError(f"stage {raw!r} is not [start, end]")
    start, end = raw
    if not 0 <= start <= end < num_tokens:  # [0, 0): a stage that claims nothing
        raise PromptError(
            f"stage claim [{start}, {end}) must lie before the last of the {num_tokens} tokens"
        )
    return start, end


def prefix_chunk_ids(token_ids: Sequence[int], block_size: int) -> list[str]:
    """Chained content id of every full block of `token_ids`."""
    ids, prev = [], PREFIX_NAMESPACE
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = chain_id(prev, token_ids[start : start + block_size])
        ids.append(prev)
    return ids


def claim_prefix(
    token_ids: Sequence[int], block_size: int, num_computed: int, present: Callable[[str], bool]
) -> int:
    """Tokens after `num_computed` the store holds as whole blocks, ending before the last token."""
    limit = (len(token_ids) - 1) // block_size  # blocks wholly before the last prompt token
    hits = 0
    for cid in prefix_chunk_ids(token_ids, block_size)[:limit]:
        if not present(cid):
            break
        hits += 1
    return max(0, hits * block_size - num_computed)


def segment_content_id(token_ids: Sequence[int], scope: str | None = None) -> str:
    """The key agentcache's engine stores a segment under (`reuse.segments.scoped`)."""
    namespace = SEGMENT_NAMESPACE if scope is None else f"{SEGMENT_NAMESPACE}@{scope}"
    return content_id(token_ids, namespace, None)


def claim_segments(
    spec: RequestSpec,
    token_ids: Sequence[int],
    num_computed: int,
    present: Callable[[str], bool],
    min_reused_fraction: float = 0.0,
) -> int:
    """Every token from `num_computed` to the last prompt token, if stored reusable segments
    cover at least `min_reused_fraction` of that span (and at least one token): the filler
    computes the rest. Otherwise nothing: vLLM computes the span, faster than the filler."""
    last = len(token_ids) - 1
    if num_computed >= last:
        return 0
    stored = 0
    for s in spec.spans:
        in_span = s.kind in REUSABLE and s.end > num_computed and s.start < last
        if in_span and present(s.content_id(token_ids)):
            stored += min(s.end, last) - max(s.start, num_computed)
    if stored == 0 or stored < min_reused_fraction * (last - num_computed):
        return 0
    return last - num_computed


def unclaimed_segments(
    spec: RequestSpec, token_ids: Sequence[int], num_computed: int, present: Callable[[str], bool]
) -> tuple[list[list[Any]], str | None]:
    """Why the reusable segments vLLM computes itself (the connector claimed nothing) were not
    served: `[segment id, kind, tokens, "new"]` for each one the store lacks, and, when some
    were stored but covered too little of the span to claim it, the fallback's reason.
    A segment counts when most of its tokens lie after vLLM's own prefix-cache hit (a
    segment the hit mostly covers was served by vLLM)."""
    last = len(token_ids) - 1
    misses: list[list[Any]] = []
    stored = []
    for s in spec.spans:
        after_hit = s.end - max(s.start, num_computed)
        if s.kind not in REUSABLE or 2 * after_hit <= s.end - s.start or s.start >= last:
            continue
        if present(s.content_id(token_ids)):
            stored.append(s.id or f"@{s.start}")
        else:
            misses.append([s.id, s.kind.value, s.end - s.start, "new"])
    reason = None
    if stored:
        reason = (
            f"stored segments {', '.join(map(str, stored))} cover too little of tokens "
            f"[{num_computed}, {last}) to claim them (min_reused_fraction): vLLM computed them"
        )
    return misses, reason


def claim_stage(
    spec: RequestSpec, token_ids: Sequence[int], num_computed: int, present: Callable[[str], bool]
) -> tuple[int, str | None]:
    """What a stage of a staged prefill claims after vLLM's hit of `num_computed` tokens: the
    rest of its run [a, b) when the hit reaches the run and every segment of it is stored;
    otherwise nothing, and (when the run was not already covered) why vLLM computes it."""
    assert spec.stage is not None
    start, end = spec.stage
    if num_computed >= end:
        return 0, None  # vLLM's own cache holds the run already
    if num_computed < start:
        return 0, (
            f"vLLM's prefix cache held {num_computed} tokens where the staged prefill expected "
            f"{start} (evicted?): vLLM computed tokens [{num_computed}, {len(token_ids)})"
        )
    for s in spec.spans:
        if s.end <= num_computed or s.start >= end:
            continue
        if s.kind not in REUSABLE or not present(s.content_id(token_ids)):
            return 0, (
                f"segment {s.id or f'@{s.start}'} of the staged run [{start}, {end}) is not "
                "stored any more: vLLM computed it"
            )
    return end - num_computed, None
