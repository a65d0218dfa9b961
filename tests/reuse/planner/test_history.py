"""The planner's view of heads (`PlanHistory.hits` with the store's head index): the opening
an update segment shares with one stored after the same context, known from the planner's
own metadata, and passed over when that metadata is missing or says another place."""

from __future__ import annotations

import torch

from agentcache.kv.store import segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.planner.history import PlanHistory
from agentcache.reuse.segments import HeadIndex, context_ids, scoped
from agentcache.runtime import Engine
from tests.reuse.test_contract import agent_prompt, update_head


def _commit(index: HeadIndex, held: set[str], prompt: TokenizedPrompt) -> None:
    """What a commit at natural positions leaves the head index and the store."""
    for seg, context in zip(prompt.segments, context_ids(prompt), strict=True):
        cid = segment_content_id(seg.ids, seg.segment.scope)
        if cid not in held:
            index.add(scoped("segment", seg), context, cid, seg.ids)
            held.add(cid)


def test_an_update_segment_s_opening_is_found_as_an_exact_head(tiny: LoadedModel) -> None:
    e = Engine(tiny)
    first, second = "memory v1", "memory v4 " * 3
    p1, p2 = e.tokenize(agent_prompt(first)), e.tokenize(agent_prompt(second))
    history, index, held = PlanHistory(), HeadIndex(), set[str]()
    history.record(p1, torch.arange(p1.num_tokens))
    _commit(index, held, p1)
    update = p2.segments[1]
    assert update.kind == SegmentKind.UPDATE
    heads = [h for h in history.hits(p2, held.__contains__, index, True)
             if h.segment is update]  # fmt: skip
    assert len(heads) == 1
    assert heads[0].num_tokens == update_head(e, first, second) > 0
    assert heads[0].stored_context == context_ids(p2)[1]
    # without update heads, or without the index, the update is not looked at
    for args in ((index, False), (None, True)):
        assert all(h.segment is not update for h in history.hits(p2, held.__contains__, *args))


def test_a_head_the_planner_did_not_record_or_stored_elsewhere_is_passed_over(
    tiny: LoadedModel,
) -> None:
    e = Engine(tiny)
    p1, p2 = e.tokenize(agent_prompt("memory v1")), e.tokenize(agent_prompt("memory v4 " * 3))
    index, held = HeadIndex(), set[str]()
    _commit(index, held, p1)
    update = p2.segments[1]
    only_update = {segment_content_id(p1.segments[1].ids, p1.segments[1].segment.scope)}
    # stored by another strategy: the index names it, this history never recorded it
    assert PlanHistory().hits(p2, only_update.__contains__, index, True) == []
    # recorded at other positions: its K/V is not exact here
    moved = PlanHistory()
    moved.record(p1, torch.arange(p1.num_tokens) + 5)
    assert all(h.segment is not update
               for h in moved.hits(p2, only_update.__contains__, index, True))  # fmt: skip
    # recorded here, but the store has dropped it since
    history = PlanHistory()
    history.record(p1, torch.arange(p1.num_tokens))
    assert all(h.segment is not update
               for h in history.hits(p2, set[str]().__contains__, index, True))  # fmt: skip
