"""`agentcache serve` on vLLM (marker `vllm`): the OpenAI-compatible app on the vLLM backend,
driven by the real `openai` client over loopback, as `tests/server` drives the embedded one.

Each server runs in a subprocess of its own (a fresh vLLM: an empty prefix cache), like the
other vLLM tests, so the test process never imports vLLM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.test_vllm_engine import _run

pytestmark = pytest.mark.vllm

SERVER_SCRIPT = """
import json, sys
import openai
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread

store, reuse, min_reused = sys.argv[1], sys.argv[2], float(sys.argv[3])
backend = VLLMBackend(VLLMConfig(reuse=reuse, store_dir=store, kv_cache_bytes=256 << 20,
                                 max_model_len=2048, min_reused_fraction=min_reused,
                                 fill="engine"))
system = ("You are a support agent for a hosting company. Be brief. Refunds are possible "
          "within 30 days; outages are credited at 10% of the monthly bill per hour. ") * 3
users = ["My server was down for two hours.", "My bill is $40. What is my credit?"]
messages = [{"role": "system", "content": system}]
turns = []
with serve_in_thread(create_app(backend, ServerConfig("default"))) as url:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    head = {"X-Agentcache-Conversation": "support-1"}
    for user in users:
        messages.append({"role": "user", "content": user})
        r = client.chat.completions.create(model="default", messages=messages, temperature=0,
                                           max_tokens=12, extra_headers=head)
        text = r.choices[0].message.content
        turns.append({"text": text, "prompt": r.usage.prompt_tokens,
                      "cached": r.usage.prompt_tokens_details.cached_tokens,
                      "report": r.model_extra["agentcache"], "transfer": backend.last_transfer})
        messages.append({"role": "assistant", "content": text})
    # the last request again, streamed: the pieces are the reply
    stream = client.chat.completions.create(model="default", messages=messages[:-1],
                                            temperature=0, max_tokens=12, stream=True,
                                            extra_headers=head)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
# a client that hangs up: on_token raises; the request is aborted, the engine serves on
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.runtime.engine import GenerationParams
prompt = SegmentedPrompt([Segment("system", system, "sys", "system"),
                          Segment("update", "Hello!", "q", "user")])
seen = []
def hang_up(token):
    seen.append(token)
    if len(seen) == 2:
        raise KeyboardInterrupt
try:
    backend.generate(prompt, GenerationParams(max_new_tokens=8), on_token=hang_up)
    aborted = False
except KeyboardInterrupt:
    aborted = True
left = backend.llm.llm_engine.has_unfinished_requests()
after = len(backend.generate(prompt, GenerationParams(max_new_tokens=8)).token_ids)
print("RESULT " + json.dumps({"turns": turns, "streamed": pieces,
                              "hang_up": [aborted, left, len(seen), after]}))
"""


def test_serve_on_vllm_reuses_the_store_and_answers_as_vllm_without_it(tmp_path: Path) -> None:
    """Two chat turns through the OpenAI client against the app on vLLM: (a) a server with
    the connector answers what vLLM without any reuse answers, its second turn reusing the
    first's prompt; (b) a restarted server (fresh vLLM, empty prefix cache, same store) is
    served both turns' segments by the connector, from the store, and answers the same."""
    store = str(tmp_path / "store")
    reference = _run(SERVER_SCRIPT, str(tmp_path / "none"), "none", "0.5")
    first = _run(SERVER_SCRIPT, store, "agentcache", "0.5")
    restarted = _run(SERVER_SCRIPT, store, "agentcache", "0.0")
    texts = [[t["text"] for t in r["turns"]] for r in (reference, first, restarted)]  # type: ignore[union-attr]
    assert all(t for t in texts[0])
    assert texts[1] == texts[0] and texts[2] == texts[0]
    ref_turns, turns, again = reference["turns"], first["turns"], restarted["turns"]
    assert isinstance(ref_turns, list) and isinstance(turns, list) and isinstance(again, list)
    assert all(t["cached"] == 0 for t in ref_turns)  # no reuse at all
    assert turns[0]["transfer"]["stored_entries"] > 0
    assert turns[1]["cached"] > 0  # turn 1's prompt, from vLLM's prefix cache
    for turn in again:  # the connector served these from the store
        info = turn["transfer"]
        assert info["mode"] == "segments" and info["claimed_tokens"] > 0, info
        assert info["reused_tokens"] > 0 and info["load_failures"] == 0
        assert turn["cached"] >= info["claimed_tokens"] - info["computed_tokens"]
        # the restarted server knows none of these conversations, yet every message the
        # first server stored (history keyed by content within the tenant) is found
        statuses = [(s["role"], s["status"]) for s in turn["report"]["segments"]]
        assert statuses[-1] == ("assistant", "computed")  # the generation prompt
        assert all(status == "hit" for _, status in statuses[:-1]), statuses
    assert "".join(restarted["streamed"]) == texts[0][1]  # type: ignore[arg-type]
    assert len(restarted["streamed"]) > 2  # type: ignore[arg-type]  # token by token
    # on_token raising (the server's, when a streaming client leaves) aborts the request
    for run in (reference, first, restarted):
        aborted, unfinished, streamed, after = run["hang_up"]  # type: ignore[misc]
        assert (aborted, unfinished, streamed) == (True, False, 2) and after > 0


RETENTION_SCRIPT = """
import json, sys
from pathlib import Path
import openai
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread

store, reuse = sys.argv[1], sys.argv[2]
backend = VLLMBackend(VLLMConfig(reuse=reuse, store_dir=store, kv_cache_bytes=256 << 20,
                                 max_model_len=2048, fill="engine", folder_bytes=64 << 20))
bound = None if backend.retention_store is None else backend.retention_store.folder_bytes
messages = [{"role": "system", "content": "You are a build agent. Be brief. " * 8},
            {"role": "user", "content": "Which file holds the settings?"}]
with serve_in_thread(create_app(backend, ServerConfig("default"))) as url:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    r = client.chat.completions.create(model="default", messages=messages, temperature=0,
                                       max_tokens=4, extra_body={"prompt_cache_retention": "24h"})
    kept = r.model_extra["agentcache"]["cache_control"]
    other = [{"role": "system", "content": "You are a review agent. Be terse. " * 8},
             {"role": "user", "content": "Is the diff safe?"}]
    client.chat.completions.create(model="default", messages=other, temperature=0, max_tokens=4)
pins = sorted(str(p.relative_to(store)) for p in Path(store).rglob("*.pin"))
entries = len(list(Path(store).rglob("*.kv")))
# a worker's eviction scan with room for nothing: only the pinned entries stay
scan = FolderSegmentStore(Path(store), 0, folder_bytes=1)
left = sorted(str(p.relative_to(store)) for p in Path(store).rglob("*.kv"))
print("RESULT " + json.dumps({"kept": kept, "pins": pins, "entries": entries, "left": left,
                              "evicted": scan.folder_evictions, "bound": bound}))
"""


def test_retention_pins_a_turns_segments_in_the_shared_folder(tmp_path: Path) -> None:
    """On vLLM with the connector a request that asks for retention is enforced: each of its
    segments in the shared folder gets a pin that another process's eviction scan passes
    over (another conversation's, unpinned, go); on vLLM alone nothing is pinned (reported
    not enforced)."""
    got = _run(RETENTION_SCRIPT, str(tmp_path / "store"), "agentcache")
    kept = got["kept"]
    assert isinstance(kept, dict) and kept["enforced"], kept
    assert kept["granted_ttl_s"] > 0 and kept["pinned_segments"] > 0
    assert kept["refused_segments"] == 0 and kept["pinned_bytes"] > 0
    pins = got["pins"]
    assert isinstance(pins, list) and len(pins) == kept["pinned_segments"]
    assert got["left"] == [p.removesuffix(".pin") + ".kv" for p in pins]
    assert isinstance(got["entries"], int) and got["entries"] > len(pins)
    assert got["evicted"] == got["entries"] - len(pins)
    assert got["bound"] == 64 << 20  # the folder's bound, of which the retained share is
    alone = _run(RETENTION_SCRIPT, str(tmp_path / "alone"), "prefix")["kept"]
    assert isinstance(alone, dict) and not alone["enforced"] and alone["pinned_segments"] == 0
