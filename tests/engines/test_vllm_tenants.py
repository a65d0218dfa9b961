"""Tenants on the vLLM backend (marker `vllm`): vLLM's own prefix cache shares blocks only
within a prompt's scope (its first segment's, the tenant's under `agentcache serve`), as the
store does. Another tenant's identical system prompt is computed, not found: its reply does
not depend on what another tenant computed (or on KV the connector filled approximately for
it), and its reported reuse names nothing of the other tenant's. Within a tenant, vLLM's
cache finds the shared prefix. Over HTTP, another API key's copy of a request is reported
`cached_tokens` 0."""

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


SERVER_SCRIPT = """
import json, sys
import openai
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.config import key_digest
from agentcache.server.inprocess import serve_in_thread

backend = VLLMBackend(VLLMConfig(store_dir=sys.argv[1], kv_cache_bytes=128 << 20,
                                 max_model_len=2048))
digests = frozenset(key_digest(k) for k in ("key-a", "key-b"))
config = ServerConfig("default", api_key_digests=digests,
                      prefix_block_tokens=backend.prefix_block_tokens)
system = "You are a careful assistant for a bicycle shop. Answer in one short sentence. " * 12
messages = [{"role": "system", "content": system},
            {"role": "user", "content": "How often should I oil the chain?"}]
out = []
with serve_in_thread(create_app(backend, config)) as url:
    for key in ("key-a", "key-b", "key-a"):
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)
        r = client.chat.completions.create(model="default", messages=messages, temperature=0,
                                           max_tokens=12)
        out.append({"text": r.choices[0].message.content,
                    "cached": r.usage.prompt_tokens_details.cached_tokens,
                    "vllm_hit": backend.last_transfer.get("vllm_cached_tokens")})
backend.close()
print("RESULT " + json.dumps({"runs": out}))
"""


def test_over_http_another_api_keys_identical_request_finds_nothing(tmp_path: Path) -> None:
    """Tenant b (another API key) sends tenant a's request word for word: vLLM's cache and
    the store give it nothing (`cached_tokens` 0) and its reply is a's; a's own repeat finds
    its blocks."""
    runs = _run(SERVER_SCRIPT, str(tmp_path / "store"))["runs"]
    assert isinstance(runs, list) and len(runs) == 3
    a, b, a_again = runs
    assert b["cached"] == 0 and b["vllm_hit"] == 0, b
    assert b["text"] == a["text"]
    assert a_again["cached"] >= 64 and a_again["text"] == a["text"]
