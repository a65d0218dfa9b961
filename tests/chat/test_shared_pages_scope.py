"""Pages held in common follow the server's trust boundary: requests of one tenant that open
alike hold the opening's pages once; another tenant's request (another API key or cache salt)
with the very same messages, the same K/V bits, holds its own."""

from __future__ import annotations

import pytest

from agentcache.chat.identity import tenant_id
from agentcache.chat.messages import ChatMessage
from agentcache.chat.segmenter import ConversationTracker
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig

SYSTEM = "You are a build assistant. Keep every step of the log in mind. " * 3


def messages(i: int) -> list[ChatMessage]:
    return [ChatMessage("system", SYSTEM), ChatMessage("user", f"step {i}: what failed?")]


@pytest.mark.parametrize("isolate", [False, True])
def test_pages_are_shared_within_a_tenant_and_never_across(
    tiny: LoadedModel, isolate: bool
) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=256))
    tracker = ConversationTracker(isolate=isolate)
    tenants = {"a": tenant_id("key-a", None), "b": tenant_id("key-a", "salt-b"),
               "c": tenant_id("key-c", None)}  # fmt: skip
    held: dict[str, tuple[SequenceKV, int]] = {}
    for name, tenant in (("a1", "a"), ("b1", "b"), ("c1", "c"), ("a2", "a")):
        prompt = tracker.segment(messages(len(held)), tenant=tenants[tenant]).prompt
        tokens = engine.tokenize(prompt)
        seq, _ = engine.prefill(tokens, "full")
        held[name] = (seq, engine._share(tokens, seq))
    a1, b1, c1, a2 = (held[n][0] for n in ("a1", "b1", "c1", "a2"))
    assert held["b1"][1] == 0 and held["c1"][1] == 0  # other tenants: nothing shared
    assert set(b1.table.pages).isdisjoint(a1.table.pages)
    assert set(c1.table.pages).isdisjoint(a1.table.pages)
    shared = held["a2"][1]
    assert shared > 0 and a2.table.pages[:shared] == a1.table.pages[:shared]
    # the other tenants' first page holds the same bits as a1's: only the scope kept them apart
    assert bool((b1.gather_all(slice(0, 16))[0] == a1.gather_all(slice(0, 16))[0]).all())
    for seq, _ in held.values():
        seq.free()
    assert engine.ctx.pool.num_used == 0
