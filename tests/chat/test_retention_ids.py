"""Retention pins what a turn stored, whatever the strategy: `chat.retention.stored_ids`
derives the ids a turn's entries are stored under (segment first copies, at-start copies,
exact and context copies, prefix blocks) without asking the strategy, so every registered
strategy is run here through a store that records what it was given and what it was asked to
pin. A strategy storing under a new kind of id fails this test instead of going unpinned."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from agentcache.chat.messages import ChatMessage, ToolSpec
from agentcache.chat.retention import TurnRetention
from agentcache.chat.runner import ChatEngine, ChatRequest
from agentcache.chat.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.retention import GapLearner, PinResult, RetentionConfig
from agentcache.kv.store import StoredKV
from agentcache.model.loading import LoadedModel
from agentcache.reuse import STRATEGIES
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

TOOL = ToolSpec("ls", "list files", {"type": "object", "properties": {}})
CALL = TOOL_CALL_OPEN + '\n{"name": "ls", "arguments": {}}\n' + TOOL_CALL_CLOSE


class RecordingStore(MemorySegmentStore):
    """Remembers every content id put and every id a retain named."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.put_ids: set[str] = set()
        self.retained_ids: set[str] = set()

    def put_content(self, cid: str, kv: StoredKV) -> bool:
        self.put_ids.add(cid)
        return super().put_content(cid, kv)

    def retain(
        self, model_id: str, tokenizer_id: str, cids: Sequence[str], seconds: float,
        owner: Hashable = None,
    ) -> PinResult:  # fmt: skip
        self.retained_ids.update(cids)
        return super().retain(model_id, tokenizer_id, cids, seconds, owner)


def turns() -> list[list[ChatMessage]]:
    """A first request; the same conversation with an earlier message rewritten (every later
    message shifted behind a changed context: reused approximately or computed exactly, so
    context or exact copies are stored); then that request again (copies found)."""
    system = ChatMessage("system", "You are a careful agent. " * 8)
    later = [ChatMessage("assistant", "The project has 4 files; the largest is main.py. " * 3),
             ChatMessage("user", "read the largest one and summarize it")]  # fmt: skip
    first = [system, ChatMessage("user", "list the files " * 6), *later]
    edited = [system, ChatMessage("user", "list the files, then count them " * 4), *later]
    return [first, edited, edited]


@pytest.mark.parametrize("name", sorted(STRATEGIES.names()))
def test_every_entry_a_turn_stores_is_pinned(tiny: LoadedModel, name: str) -> None:
    store = RecordingStore(1 << 30)
    eng = Engine(tiny, EngineConfig(strategy=name, kv_pages=256), store=store)
    config = RetentionConfig(default_s=30, max_s=600, pinned_share=1.0, tenant_share=1.0)
    ce = ChatEngine(eng, retention=TurnRetention(eng, config, learner=GapLearner(config)))
    stored = []
    for messages in turns():
        store.put_ids.clear()
        store.retained_ids.clear()
        req = ChatRequest(tuple(messages), GenerationParams(max_new_tokens=1), (TOOL,),
                          prefill=CALL, retention_s=60.0)  # fmt: skip
        result = ce.run(ce.prepare(req))
        assert result.retention is not None and result.retention.source == "request"
        assert store.put_ids <= store.retained_ids, sorted(store.put_ids - store.retained_ids)
        stored.append(len(store.put_ids))
    if name != "full":  # `full` stores nothing
        assert stored[0] > 0 and stored[1] > 0, stored  # the first and the edited turn stored
