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

from agentcache.engines.vllm.reports import MissRow
from agentcache.engines.vllm.request import RequestSpec
from agentcache.kv.store import chain_id
from agentcache.reuse.segments import REUSABLE

PREFIX_NAMESPACE = "vllm-prefix"


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
) -> tuple[list[MissRow], str | None]:
    """Why the reusable segments vLLM computes itself (the connector claimed nothing) were not
    served: `(segment id, kind, tokens, "new")` for each one the store lacks, and, when some
    were stored but covered too little of the span to claim it, the fallback's reason.
    A segment counts when most of its tokens lie after vLLM's own prefix-cache hit (a
    segment the hit mostly covers was served by vLLM)."""
    last = len(token_ids) - 1
    misses: list[MissRow] = []
    stored = []
    for s in spec.spans:
        after_hit = s.end - max(s.start, num_computed)
        if s.kind not in REUSABLE or 2 * after_hit <= s.end - s.start or s.start >= last:
            continue
        if present(s.content_id(token_ids)):
            stored.append(s.id or f"@{s.start}")
        else:
            misses.append((s.id, s.kind.value, s.end - s.start, "new"))
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
