"""Turns batch in vLLM's engine (marker `vllm`): four turns from four threads through one
`VLLMBackend`, prompts of different lengths, greedy, each give the token ids the same prompt
gives run alone, and the step loop held them in the engine, and stepped them, at once.

One subprocess per reuse setting (a fresh vLLM each), as the other vLLM tests run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.test_vllm_engine import _run

pytestmark = pytest.mark.vllm

BATCH_SCRIPT = """
import json, sys, threading
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.runtime.engine import GenerationParams

store, reuse = sys.argv[1], sys.argv[2]
# fill="engine" with min_reused_fraction=1: the connector claims no span that holds an update
# segment, so every turn is computed by vLLM, alone or batched (what is compared here)
backend = VLLMBackend(VLLMConfig(reuse=reuse, store_dir=store, kv_cache_bytes=256 << 20,
                                 max_model_len=2048, fill="engine", min_reused_fraction=1.0))
system = "You are a careful assistant for a bicycle shop. Answer in one short sentence. "
questions = ["What is a derailleur?", "How often should I oil the chain?",
             "Which tyre pressure suits a city bike?", "Why does my brake squeal?"]
prompts = [SegmentedPrompt([Segment("system", system * (1 + 5 * i), f"s{i}", "system"),
                            Segment("update", q, "q", "user")])
           for i, q in enumerate(questions)]
params = GenerationParams(max_new_tokens=12)
alone = [list(backend.generate(p, params).token_ids) for p in prompts]
backend.llm.reset_prefix_cache()  # the batched turns compute their prompts again
streamed = [[] for _ in prompts]
batched = [None] * len(prompts)
start = threading.Barrier(len(prompts))
def turn(i):
    start.wait()
    g = backend.generate(prompts[i], params, on_token=streamed[i].append)
    batched[i] = {"ids": list(g.token_ids), "ttft": g.stats.ttft_s,
                  "prompt": g.stats.prompt_tokens}
threads = [threading.Thread(target=turn, args=(i,)) for i in range(len(prompts))]
for t in threads:
    t.start()
for t in threads:
    t.join()
stats = backend.driver.loop.stats
blocks = backend.llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
backend.close()
print("RESULT " + json.dumps({"alone": alone, "batched": batched, "streamed": streamed,
                              "max_held": stats.max_held, "max_stepped": stats.max_stepped,
                              "max_active": backend.max_active, "kv_tokens": blocks * 32}))
"""


@pytest.mark.parametrize("reuse", ["agentcache", "prefix"])
def test_batched_turns_give_what_each_gives_alone(tmp_path: Path, reuse: str) -> None:
    result = _run(BATCH_SCRIPT, str(tmp_path / "store"), reuse)
    alone, batched = result["alone"], result["batched"]
    assert isinstance(alone, list) and isinstance(batched, list)
    assert all(len(ids) > 0 for ids in alone)
    assert len({b["prompt"] for b in batched}) == 4  # four different lengths
    assert [b["ids"] for b in batched] == alone
    assert result["streamed"] == alone  # each turn's on_token saw exactly its own tokens
    assert all(b["ttft"] > 0 for b in batched)
    assert result["max_held"] == 4  # every turn's request in the engine at once
    assert isinstance(result["max_stepped"], int) and result["max_stepped"] > 1
    kv_tokens = result["kv_tokens"]  # vLLM's KV cache, in tokens: the default --max-active
    assert isinstance(kv_tokens, int) and kv_tokens > 0
    assert result["max_active"] == min(256, max(1, kv_tokens // 2048)), kv_tokens
