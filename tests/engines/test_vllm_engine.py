"""vLLM end to end (marker `vllm`: needs the vllm extra; each engine start is ~20 s on CPU).

Every engine runs in a subprocess of its own, so "two engine processes" is literal and the
test process never imports vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

PREFIX_SCRIPT = """
import json, sys
from pathlib import Path
from vllm import SamplingParams
from agentcache.workload.files import load_workload
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig

store, reuse = sys.argv[1], sys.argv[2]
b = VLLMBackend(VLLMConfig(reuse=reuse, store_dir=store, kv_cache_bytes=256 << 20,
                           max_model_len=4096))
turn = load_workload(Path("benchmarks/workloads/memgpt.jsonl")).sessions[0].turns[0]
ids = list(b.tokenize(turn.prompt).ids[:400])
out = b.llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=16),
                     use_tqdm=False)[0]
info = (out.kv_transfer_params or {}).get("agentcache", {})
print("RESULT " + json.dumps({"tokens": list(out.outputs[0].token_ids), "info": info}))
"""

SESSION_SCRIPT = """
import json, sys
import torch
from agentcache.model.loading import load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.session import AgentSession

store, strategy, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
system = ("You are a travel agent. You plan trips, check the weather tool and keep notes. "
          "Answer briefly and cite the notes you used. ") * 6
history = [
    "User: I want to visit Lisbon in May. Assistant: Lisbon in May is warm and dry; I noted it.",
    "Tool weather(Lisbon, May): average high 22C, low 14C, rain on 4 days of 31.",
    "User: Also consider Porto. Assistant: Porto is cooler and wetter than Lisbon in May.",
]
def turn(state):
    segs = [Segment("system", system, "sys", "system"), Segment("update", state, "state", "user")]
    segs += [Segment("fixed", h, f"h{i}", "user") for i, h in enumerate(history)]
    segs += [Segment("update", "Which city is warmer in May, and by how much? The", "q", "user")]
    return SegmentedPrompt(segs)
states = ["Notes: budget 900 EUR.", "Notes: budget 900 EUR. Flights from Berlin cost 120 EUR. "
          "Hotels in Lisbon average 95 EUR a night; Porto 80 EUR. The user prefers the coast. " * 3]
params = GenerationParams(max_new_tokens=1)
session = AgentSession.create("vllm", strategy=strategy, params=params, reuse="agentcache",
                              store_dir=store, kv_cache_bytes=256 << 20, max_model_len=2048,
                              **options)
backend = session.engine
out = []
for s in states:
    g = session.turn(turn(s))
    out.append({"token": g.token_ids[0], "info": backend.last_transfer,
                "reused": g.stats.reused_tokens, "prompt": g.stats.prompt_tokens})
engine = Engine(load_model(None), EngineConfig(strategy=strategy))
ref = [engine.generate(turn(s), params).token_ids[0] for s in states]
print("RESULT " + json.dumps({"turns": out, "engine": ref}))
"""


def _run(script: str, *args: str) -> dict[str, object]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def test_prefix_kv_stored_by_one_engine_is_loaded_by_another(tmp_path: Path) -> None:
    """Greedy tokens with KV loaded from the store == with no connector at all."""
    store = str(tmp_path / "store")
    reference = _run(PREFIX_SCRIPT, store, "none")
    first = _run(PREFIX_SCRIPT, store, "agentcache")  # computes, then stores its blocks
    second = _run(PREFIX_SCRIPT, store, "agentcache")  # a fresh process: loads them
    assert first["info"]["stored_entries"] == 12  # type: ignore[index]
    assert second["info"]["claimed_tokens"] == 384  # type: ignore[index]
    assert second["info"]["load_failures"] == 0  # type: ignore[index]
    assert first["tokens"] == reference["tokens"]
    assert second["tokens"] == reference["tokens"]


def test_shifted_segments_are_served_by_the_connector(tmp_path: Path) -> None:
    """Turn 2's update grows, so its history shifts: vLLM's prefix cache stops at the system
    prompt; the connector claims the rest, reuses the history re-rotated, and the first token
    is the one agentcache's own engine gives with the same strategy."""
    options = '{"min_reused_fraction": 0, "fill": "engine"}'
    result = _run(SESSION_SCRIPT, str(tmp_path / "store"), "rpdc", options)
    turns = result["turns"]
    assert isinstance(turns, list)
    first, second = turns
    assert first["info"]["claimed_tokens"] == 0 and first["info"]["stored_entries"] > 0
    info = second["info"]
    assert info["mode"] == "segments" and info["claimed_tokens"] > 0
    assert info["vllm_cached_tokens"] + info["claimed_tokens"] == second["prompt"] - 1
    assert info["reused_tokens"] > 0 and info["fallbacks"] == 0
    assert [t["token"] for t in turns] == result["engine"]


STAGED_SCRIPT = (
    SESSION_SCRIPT.split("session = AgentSession")[0]
    + """
from pathlib import Path
from agentcache.engines.vllm.request import segment_content_id
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.kv.pool import SequenceKV
from agentcache.reuse.base import ReuseStats, compute_subset
session = AgentSession.create("vllm", strategy=strategy, params=params, reuse="agentcache",
                              store_dir=store, kv_cache_bytes=256 << 20, max_model_len=2048,
                              fill="vllm", min_stage_tokens=32)
backend = session.engine
out = []
for s in states:
    tokens = backend.tokenize(turn(s))
    plan = backend.stage_plan(tokens, backend.staged())  # what the turn will compute
    g = session.turn(turn(s))
    top = int(g.first_token_logits.argmax())
    out.append({"token": g.token_ids[0], "logprob": float(g.first_token_logits[top]),
                "info": backend.last_transfer, "reused": g.stats.reused_tokens,
                "prompt": g.stats.prompt_tokens})
# the reference for the last turn: agentcache's forward computing exactly the plan's tokens
# over the stored KV (as vLLM's pages gave it to the store), re-rotated where it is reused
model = load_model(None)
engine = Engine(model)
shared = FolderSegmentStore(Path(store), 1 << 30)
seq = SequenceKV(engine.ctx.pool)
seq.extend(tokens.num_tokens)
for seg in tokens.segments:
    found = shared.lookup_content(model.model_id, model.tokenizer.tokenizer_id,
                                  segment_content_id(seg.ids, seg.segment.scope))
    if found.kv is not None and found.kv.num_tokens == len(seg.ids):
        new = torch.arange(seg.start, seg.end)
        keys = model.forward.rope.rerotate(found.kv.keys, found.kv.positions, new)
        seq.write_all(seq.slots()[seg.start : seg.end], keys, found.kv.values)
idx = torch.tensor([i for i, c in enumerate(plan.computed) if c])
with torch.inference_mode():
    logits = compute_subset(engine.ctx, tokens, seq, idx, ReuseStats(tokens.num_tokens, 1))
ref = torch.log_softmax(logits.float(), dim=-1)
print("RESULT " + json.dumps({"turns": out, "ref_token": int(ref.argmax()),
                              "ref_logprob": float(ref.max())}))
"""
)


def test_a_staged_prefill_lets_vllm_compute_and_the_store_supply(tmp_path: Path) -> None:
    """fill='vllm': turn 2 runs as a staged prefill: vLLM computes the grown update (and the
    last tokens), the connector writes the shifted history from the store, nothing else
    computes. Its first token and log-probability are those of agentcache's own forward
    computing the same tokens over the same stored KV."""
    result = _run(STAGED_SCRIPT, str(tmp_path / "store"), "pic", "{}")
    turns = result["turns"]
    assert isinstance(turns, list)
    first, second = turns
    assert first["info"]["stages"] == 1 and first["info"]["stored_entries"] > 0
    info = second["info"]
    assert info["mode"] == "staged" and info["stages"] == 2, info
    assert info["claimed_tokens"] > 0 and info["reused_tokens"] == info["claimed_tokens"]
    assert info["computed_tokens"] == 0 and info["fallbacks"] == 0 and info["load_failures"] == 0
    # vLLM computed what the plan said (its prefix cache carried stage 1 into stage 2)
    assert info["vllm_computed_tokens"] == info["planned_computed_tokens"]
    assert second["prompt"] - second["reused"] == info["vllm_computed_tokens"]
    assert second["token"] == result["ref_token"]
    assert abs(second["logprob"] - result["ref_logprob"]) < 1e-3


BF16_SCRIPT = """
import json, sys
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
try:
    VLLMBackend(VLLMConfig(dtype="bfloat16", store_dir=sys.argv[1], kv_cache_bytes=128 << 20,
                           max_model_len=1024))
    print("RESULT " + json.dumps({"raised": None}))
except Exception as e:
    print("RESULT " + json.dumps({"raised": type(e).__name__, "message": str(e)}))
"""


def test_unsupported_kv_setup_is_refused_at_start_up(tmp_path: Path) -> None:
    """bf16 KV cannot take the float32 filler's KV (and bf16 selects the CPU "amx" kernel,
    whose block layout is unverified): vLLM does not start, with a message saying why."""
    result = _run(BF16_SCRIPT, str(tmp_path / "store"))
    assert result["raised"] == "UnsupportedKVLayoutError"
    assert "dtype='float32'" in str(result["message"])


HOSTILE_SCRIPT = """
import json, sys
from pathlib import Path
from vllm import SamplingParams
from agentcache.workload.files import load_workload
from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig

store = sys.argv[1]
b = VLLMBackend(VLLMConfig(reuse="agentcache", store_dir=store, kv_cache_bytes=256 << 20,
                           max_model_len=4096))
turn = load_workload(Path("benchmarks/workloads/memgpt.jsonl")).sessions[0].turns[0]
ids = list(b.tokenize(turn.prompt).ids[:200])
n = len(ids)
bad = [
    {"agentcache": {"segments": [["fixed", 0, n, "h", "someone-elses-conversation"]]}},
    {"agentcache": {"segments": [["fixed", 0, n / 2, "h"], ["fixed", n / 2, n, "q"]]}},
    {"agentcache": {"segments": [["fixed", 0, n, "h"]], "strategy": "evil:x=1"}},
    {"agentcache": [1, 2, 3]},
    {"agentcache": {"segments": [["fixed", 0, n, "h"]], "report": "../../etc/passwd"}},
    {"agentcache": {"segments": [["fixed", 0, n, "h"]], "colour": "red"}},
    None,
]
params = [SamplingParams(temperature=0, max_tokens=8, extra_args={"kv_transfer_params": p})
          for p in bad]
outs = b.llm.generate([{"prompt_token_ids": ids}] * len(bad), params, use_tqdm=False)
print("RESULT " + json.dumps([
    {"tokens": list(o.outputs[0].token_ids),
     "reasons": (o.kv_transfer_params or {}).get("agentcache", {}).get(
         "scheduler_fallback_reasons", [])}
    for o in outs]))
"""


def test_malformed_client_params_fall_back_to_prefix_reuse_and_say_why(tmp_path: Path) -> None:
    """vLLM's server copies a body's kv_transfer_params into the request: each malformed one
    is refused by name and served with exact prefix reuse; the engine keeps serving."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE_SCRIPT, str(tmp_path / "store")],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    results = json.loads(lines[-1].removeprefix("RESULT "))
    expected = ["not signed", "span ends must be integers", "unknown reuse strategy 'evil'",
                "must be an object", "report name must be alphanumeric", "'colour'"]  # fmt: skip
    for got, why in zip(results, expected, strict=False):
        assert len(got["reasons"]) == 1 and why in got["reasons"][0], got["reasons"]
    assert results[-1]["reasons"] == []
    assert all(r["tokens"] == results[-1]["tokens"] for r in results)
