"""A conversation whose KV vLLM evicted (marker `vllm`): under `fill="auto"` with a strategy
that ranks while it runs (the default `rpdc`), a turn that vLLM computes is planned as a
staged prefill that claims the stored exact prefix, so the connector loads from the store
what vLLM's own prefix cache lost, instead of vLLM computing it again; the greedy reply is
the one the same turn gives with vLLM's cache intact, the per-token report adds up, and the
segment the store lacked is reported as new (before, every segment of a turn vLLM computed
after its own hit read as found); a shifted turn the connector's engine fills reports each
token's use as the strategy's masks say.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.test_vllm_engine import _run

pytestmark = pytest.mark.vllm

SCRIPT = """
import json, sys
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.runtime.engine import GenerationParams
from agentcache.runtime.stats import TokenUse

backend = VLLMBackend(VLLMConfig(store_dir=sys.argv[1], kv_cache_bytes=128 << 20,
                                 max_model_len=2048))
system = "You are a careful assistant for a bicycle shop. Answer in one short sentence. " * 12
first = [Segment("system", system, "sys", "system"),
         Segment("update", "What is a derailleur?", "q1", "user")]
second = SegmentedPrompt([*first[:1], Segment("fixed", "What is a derailleur?", "q1", "user"),
                          Segment("fixed", "It moves the chain between gears.", "a1", "assistant"),
                          Segment("update", "How often should I oil the chain?", "q2", "user")])
params = GenerationParams(max_new_tokens=12)
opening = backend.generate(SegmentedPrompt(first), params)  # computes, stores its segments
backend.decider.chooser().choose = lambda *_: "vllm"  # vLLM computes what is not stored
backend.llm.reset_prefix_cache()  # vLLM's own cache lost the conversation (evicted)
evicted = backend.generate(second, params)
info_evicted = dict(backend.last_transfer)
again = backend.generate(second, params)  # vLLM's cache holds the whole prompt now
info_again = dict(backend.last_transfer)
tokens = backend.tokenize(second)
# the connector's engine fills a shifted turn: a note before the history moves it
backend.decider.chooser().choose = lambda *_: "engine"
backend.llm.reset_prefix_cache()
note = Segment("fixed", "Note: the shop opens at nine.", "n", "user")
filled = backend.generate(SegmentedPrompt([first[0], note, *second.segments[1:]]), params)
info_filled = dict(backend.last_transfer)
backend.close()
def split(g):
    u = g.stats.token_reuse
    return None if u is None else {x.value: u.count(x) for x in TokenUse}
print("RESULT " + json.dumps({
    "ids": [list(evicted.token_ids), list(again.token_ids)],
    "mode": [info_evicted.get("mode"), info_again.get("mode")],
    "claimed": info_evicted.get("claimed_tokens", 0),
    "vllm_hit": info_evicted.get("vllm_cached_tokens"),
    "reused": [evicted.stats.reused_tokens, again.stats.reused_tokens],
    "split": split(evicted), "prompt": tokens.num_tokens,
    "opening": [split(opening), opening.stats.prompt_tokens],
    "misses": [[m.segment_id, str(m.reason)] for m in evicted.stats.misses],
    "filled": [info_filled.get("mode"), info_filled.get("claimed_tokens", 0), split(filled),
               filled.stats.reused_tokens, filled.stats.prompt_tokens],
    "history_end": next(s.start for s in tokens.segments if s.segment.id == "a1"),
}))
"""


def test_an_evicted_conversations_stored_prefix_is_loaded_not_computed(tmp_path: Path) -> None:
    r = _run(SCRIPT, str(tmp_path / "store"))
    assert r["mode"] == ["staged", "staged"]
    assert r["vllm_hit"] == 0  # vLLM's cache was reset: nothing of it held the prompt
    history_end = r["history_end"]  # the system message and the first question were stored
    assert isinstance(history_end, int) and history_end > 64
    stored_prefix = history_end // 32 * 32  # in whole vLLM blocks
    assert r["claimed"] == stored_prefix  # loaded from the store, not computed by vLLM
    reused = r["reused"]
    assert isinstance(reused, list) and reused[0] == stored_prefix
    assert reused[1] > reused[0]  # vLLM's cache, holding the whole prompt, gives more
    prompt = r["prompt"]
    assert r["split"] == {"exact": stored_prefix, "moved": 0, "refreshed": 0,
                          "computed": prompt - stored_prefix}  # fmt: skip
    opening, opening_tokens = r["opening"]  # nothing stored, nothing claimed: all computed
    assert opening == {"exact": 0, "moved": 0, "refreshed": 0, "computed": opening_tokens}
    # the reply the store lacked is named as new (vLLM computed it); nothing else is a miss
    assert r["misses"] == [["a1", "new"]]
    ids = r["ids"]
    assert isinstance(ids, list) and len(ids[0]) > 0 and ids[0] == ids[1]
    # the engine's fill: vLLM's hit, the strategy's use of each token of the span, the rest
    mode, claimed, use, reused_tokens, prompt_tokens = r["filled"]
    assert mode == "segments" and claimed > 0 and isinstance(use, dict)
    assert sum(use.values()) == prompt_tokens
    assert use["exact"] + use["moved"] + use["refreshed"] == reused_tokens
    # the history after the note was stored before it: found, and (few tokens: the default's
    # cover_min) computed again for fidelity; the system message before the note is exact
    assert use["exact"] > 0 and use["moved"] + use["refreshed"] > 0, use
