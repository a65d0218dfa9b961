"""Turns batch in vLLM's engine (marker `vllm`): four turns from four threads through one
`VLLMBackend`, prompts of different lengths, greedy, each give the token ids the same prompt
gives run alone, and the step loop held them in the engine, and stepped them, at once; and
the same when vLLM's KV cache runs out and it preempts some of them.

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
                              "max_active": backend.max_active, "kv_tokens": blocks * 32,
                              "backend_kv_tokens": backend.kv_tokens}))
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
    kv_tokens = result["kv_tokens"]  # vLLM's KV cache, in tokens: the default token bound
    assert isinstance(kv_tokens, int) and kv_tokens > 0
    assert result["max_active"] == 256 and result["backend_kv_tokens"] == kv_tokens


PREEMPT_SCRIPT = """
import json, sys, threading
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.runtime.engine import GenerationParams

store = sys.argv[1]
# 64 MiB of KV: 45 blocks of 32 tokens for the default model. Four prompts of ~250 tokens, no
# prefix in common, take 32 blocks and are admitted together; their 200-token replies then
# need 28 more, so vLLM preempts some (their blocks freed, prompts computed again on resume)
backend = VLLMBackend(VLLMConfig(store_dir=store, kv_cache_bytes=64 << 20,
                                 max_model_len=1024, fill="engine"))
scheduler = backend.llm.llm_engine.engine_core.engine_core.scheduler
preempted = []
preempt = scheduler._preempt_request
def counting(request, *args, **kwargs):
    preempted.append(request.request_id)
    return preempt(request, *args, **kwargs)
scheduler._preempt_request = counting
system = ("You are a patient maths tutor. You write every number out in digits, one per line, "
          "and you never stop a list early. ") * 8
asks = {"Ada": "List the numbers from 1 to 200, one per line.",
        "Bea": "List the even numbers from 2 to 400, one per line.",
        "Cy": "List the numbers from 300 to 500, one per line.",
        "Dov": "List the multiples of 3 from 3 to 600, one per line."}
prompts = [SegmentedPrompt([Segment("system", f"Your name is {name}. " + system, "sys", "system"),
                            Segment("update", ask, "q", "user")])
           for name, ask in asks.items()]
params = GenerationParams(max_new_tokens=200)
alone = [list(backend.generate(p, params).token_ids) for p in prompts]  # computes and stores
preempted_alone = len(preempted)
counted_alone = backend.preemptions
backend.llm.reset_prefix_cache()  # the batched turns find their prompts in the store only
reports, per_request = {}, {}
report = backend.transfer_report
def keep(sampling_params, out):
    info = report(sampling_params, out)
    reports[out.request_id] = info.get("claimed_tokens", 0)
    per_request[out.request_id] = info.get("preemptions")
    return info
backend.transfer_report = keep
batched = [None] * len(prompts)
start = threading.Barrier(len(prompts))
def turn(i):
    start.wait()
    batched[i] = list(backend.generate(prompts[i], params).token_ids)
threads = [threading.Thread(target=turn, args=(i,)) for i in range(len(prompts))]
for t in threads:
    t.start()
for t in threads:
    t.join()
claimed = {rid: n for rid, n in reports.items() if any(p.startswith(rid) for p in preempted)}
counted = backend.preemptions
backend.close()
print("RESULT " + json.dumps({"alone": alone, "batched": batched,
                              "preempted_alone": preempted_alone, "preempted": len(preempted),
                              "claimed": list(reports.values()),
                              "claimed_preempted": list(claimed.values()),
                              "counted_alone": counted_alone, "counted": counted,
                              "per_request": list(per_request.values())}))
"""


def test_turns_vllm_preempts_give_what_each_gives_alone(tmp_path: Path) -> None:
    """vLLM's preemption frees a running request's blocks and computes its tokens again when
    it resumes; the connector fills the resumed prompt from the store again (its claim is
    made anew), counts the preemptions (`VLLMBackend.preemptions`, each request's report),
    and every greedy reply equals the same prompt's alone."""
    result = _run(PREEMPT_SCRIPT, str(tmp_path / "store"))
    alone, batched = result["alone"], result["batched"]
    assert isinstance(alone, list) and all(len(ids) == 200 for ids in alone)
    assert result["preempted_alone"] == 0  # one at a time fits
    assert isinstance(result["preempted"], int) and result["preempted"] >= 1
    assert batched == alone
    claimed = result["claimed"]
    assert isinstance(claimed, list) and len(claimed) == 4
    assert all(n > 0 for n in claimed)  # every batched prompt was filled from the store
    again = result["claimed_preempted"]  # a request resumed reclaims (or vLLM still has it)
    assert isinstance(again, list) and again
    assert max(again) > min(claimed)  # at least one resumed request was filled twice
    # the connector counts each preemption in its request's report, the backend their sum
    assert result["counted_alone"] == 0
    per_request = result["per_request"]
    assert isinstance(per_request, list) and len(per_request) == 4
    assert sum(per_request) == result["counted"] == result["preempted"]
