"""Tenants on the vLLM backend (marker `vllm`): vLLM's own prefix cache shares blocks only
within a prompt's scope (its first segment's, the tenant's under `agentcache serve`), as the
store does. Another tenant's identical system prompt is computed, not found: its reply does
not depend on what another tenant computed (or on KV the connector filled approximately for
it), and its reported reuse names nothing of the other tenant's. Within a tenant, vLLM's
cache finds the shared prefix."""

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

backend = VLLMBackend(VLLMConfig(store_dir=sys.argv[1], kv_cache_bytes=128 << 20,
                                 max_model_len=2048))
system = "You are a careful assistant for a bicycle shop. Answer in one short sentence. " * 12
def prompt(scope, question):
    return SegmentedPrompt([Segment("system", system, "sys", "system", scope),
                            Segment("update", question, "q", "user", scope)])
params = GenerationParams(max_new_tokens=12)
runs = {}
for name, scope, question in [("a", "tenant-a", "What is a derailleur?"),
                              ("a2", "tenant-a", "How often should I oil the chain?"),
                              ("b", "tenant-b", "How often should I oil the chain?")]:
    g = backend.generate(prompt(scope, question), params)
    info = dict(backend.last_transfer)
    runs[name] = {"ids": list(g.token_ids), "reused": g.stats.reused_tokens,
                  "vllm_hit": info.get("vllm_cached_tokens"),
                  "misses": sorted(str(m.reason) for m in g.stats.misses)}
# the same prompt again, tenant b: now its own blocks are in vLLM's cache
g = backend.generate(prompt("tenant-b", "How often should I oil the chain?"), params)
runs["b2"] = {"ids": list(g.token_ids), "reused": g.stats.reused_tokens,
              "vllm_hit": dict(backend.last_transfer).get("vllm_cached_tokens")}
backend.close()
print("RESULT " + json.dumps(runs))
"""


def test_vllms_prefix_cache_shares_nothing_across_tenants(tmp_path: Path) -> None:
    r = _run(SCRIPT, str(tmp_path / "store"))
    a2, b, b2 = r["a2"], r["b"], r["b2"]
    assert isinstance(a2, dict) and isinstance(b, dict) and isinstance(b2, dict)
    # within tenant a, the system prompt's blocks are found (vLLM's cache or the store)
    assert a2["reused"] >= 64
    # tenant b sent the same system prompt and question as a2: nothing of a's is found
    assert b["vllm_hit"] == 0, b
    assert b["reused"] == 0, b
    # and its reply is a2's (the same prompt, exact either way)
    assert b["ids"] == a2["ids"]
    # tenant b's own blocks are found on its next request
    assert b2["vllm_hit"] >= 64 and b2["ids"] == b["ids"]
