"""What the connector claims, and request segment specs (no vLLM)."""

from __future__ import annotations

import pytest

from agentcache.engines.vllm.plan import (
    claim_prefix,
    claim_segments,
    prefix_chunk_ids,
    unclaimed_segments,
)
from agentcache.engines.vllm.request import RequestSpec, SegmentSpan
from agentcache.errors import PromptError
from agentcache.kv.store import content_id, segment_content_id
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedSegment
from agentcache.reuse.segments import scoped


def test_prefix_claim_is_the_stored_run_of_blocks_before_the_last_token() -> None:
    ids = list(range(100))
    chunks = prefix_chunk_ids(ids, 32)
    assert len(chunks) == 3
    assert claim_prefix(ids, 32, 0, lambda c: True) == 96
    assert claim_prefix(ids, 32, 32, lambda c: True) == 64  # vLLM already has block 0
    assert claim_prefix(ids, 32, 0, lambda c: c != chunks[1]) == 32  # a gap ends the run
    assert claim_prefix(ids[:96], 32, 0, lambda c: True) == 64  # never the last token


def test_prefix_chunk_ids_chain_the_whole_prefix() -> None:
    a = prefix_chunk_ids([1] * 32 + [2] * 32, 32)
    b = prefix_chunk_ids([3] * 32 + [2] * 32, 32)
    assert a[1] != b[1]  # same block, different prefix


SPANS = (
    SegmentSpan(SegmentKind.SYSTEM, 0, 10, "sys"),
    SegmentSpan(SegmentKind.UPDATE, 10, 25, "u"),
    SegmentSpan(SegmentKind.FIXED, 25, 60, "h"),
    SegmentSpan(SegmentKind.UPDATE, 60, 64, "q"),
)


def test_segment_claim_covers_up_to_the_last_token_when_a_segment_is_stored() -> None:
    ids = list(range(64))
    spec = RequestSpec(SPANS, "rpdc")
    fixed = segment_content_id(ids[25:60])
    assert claim_segments(spec, ids, 0, lambda c: c == fixed) == 63
    assert claim_segments(spec, ids, 32, lambda c: c == fixed) == 31
    assert claim_segments(spec, ids, 0, lambda c: False) == 0
    update = segment_content_id(ids[10:25])
    assert claim_segments(spec, ids, 0, lambda c: c == update) == 0  # updates are not reused


def test_segment_claim_needs_the_stored_share_of_the_span() -> None:
    ids = list(range(64))
    spec = RequestSpec(SPANS, "rpdc")
    fixed = segment_content_id(ids[25:60])  # 35 of the 63 tokens before the last
    assert claim_segments(spec, ids, 0, lambda c: c == fixed, 0.5) == 63
    assert claim_segments(spec, ids, 0, lambda c: c == fixed, 0.6) == 0
    system = segment_content_id(ids[0:10])
    assert claim_segments(spec, ids, 0, lambda c: c in (fixed, system), 0.6) == 63


def test_spec_round_trips_through_params_and_tokenizes() -> None:
    spec = RequestSpec(SPANS, "pic")
    back = RequestSpec.parse(spec.to_params(), 64)
    assert back == spec and back.mode == "segments"
    prompt = back.tokenized(list(range(64)))
    assert [s.start for s in prompt.segments] == [0, 10, 25, 60]
    assert prompt.segments[2].ids == tuple(range(25, 60))
    assert RequestSpec.parse(None, 64).mode == "prefix"


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ([["fixed", 0, 10, None], ["fixed", 12, 64, None]], "tile the prompt"),
        ([["fixed", 0, 10, None]], "cover 10 tokens"),
        ([["memory", 0, 64, None]], "unknown segment kind"),
        ([["fixed", 0, 64]], "is not"),
    ],
)
def test_bad_spans_are_prompt_errors(spans: list[list[object]], message: str) -> None:
    with pytest.raises(PromptError, match=message):
        RequestSpec.parse({"agentcache": {"segments": spans}}, 64)


def test_scoped_segments_are_keyed_as_the_embedded_engine_keys_them() -> None:
    """The server scopes a conversation's history to it: the connector must key (and so
    isolate) those segments exactly as agentcache's engine does."""
    ids = list(range(64))
    scoped_spans = tuple(SegmentSpan(s.kind, s.start, s.end, s.id, "conv-1") for s in SPANS)
    spec = RequestSpec(scoped_spans, "rpdc")
    back = RequestSpec.parse(spec.to_params("k1"), 64, "k1")
    assert back == spec
    seg = back.tokenized(ids).segments[2]
    assert seg.segment.scope == "conv-1"
    engine_key = content_id(seg.ids, scoped("segment", seg), None)
    assert scoped_spans[2].content_id(ids) == engine_key
    unscoped = TokenizedSegment(Segment(SegmentKind.FIXED, "", "h"), seg.ids, 25)
    assert SPANS[2].content_id(ids) == content_id(seg.ids, scoped("segment", unscoped), None)
    assert engine_key != SPANS[2].content_id(ids)  # another conversation does not see it
    assert claim_segments(spec, ids, 0, lambda c: c == SPANS[2].content_id(ids)) == 0
    # the four-field spans of earlier clients still parse (no scope)
    old = {"agentcache": {"segments": [[s.kind.value, s.start, s.end, s.id] for s in SPANS]}}
    assert RequestSpec.parse(old, 64).spans == SPANS


def test_unclaimed_segments_say_why_vllm_computed_them() -> None:
    ids = list(range(64))
    spec = RequestSpec(SPANS, "rpdc")
    fixed = SPANS[2].content_id(ids)
    misses, reason = unclaimed_segments(spec, ids, 0, lambda c: False)
    assert misses == [("sys", "system", 10, "new"), ("h", "fixed", 35, "new")]
    assert reason is None
    misses, reason = unclaimed_segments(spec, ids, 0, lambda c: c == fixed)
    assert misses == [("sys", "system", 10, "new")]
    assert reason is not None and "h" in reason and "[0, 63)" in reason
    # vLLM's own prefix cache already holds the system segment: only what follows is reported
    misses, _ = unclaimed_segments(spec, ids, 16, lambda c: False)
    assert misses == [("h", "fixed", 35, "new")]
    # a hit covering most of a segment served it: neither a miss nor a declined claim
    assert unclaimed_segments(spec, ids, 48, lambda c: c == fixed) == ([], None)
    assert unclaimed_segments(spec, ids, 32, lambda c: False) == ([("h", "fixed", 35, "new")], None)
