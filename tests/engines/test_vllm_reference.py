"""The reference connector against the real one, through vLLM (marker `vllm`): each engine
computes a few prompts sharing prefixes (storing their blocks), forgets its own prefix cache,
and runs them again from its store; every run gives the tokens vLLM gives alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engines.test_vllm_engine import _run

pytestmark = pytest.mark.vllm

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig
from agentcache.engines.vllm.config import ConnectorSettings, default_model_folder
from agentcache.engines.vllm.config import kv_transfer_config

store, which = sys.argv[1], sys.argv[2]
if which == "reference":
    ktc = KVTransferConfig(kv_connector="ReferenceConnector", kv_role="kv_both",
                           kv_connector_module_path="agentcache.engines.vllm.reference",
                           kv_connector_extra_config={"store_dir": store})
elif which == "agentcache":
    ktc = kv_transfer_config(ConnectorSettings(store_dir=store, segments=False))
else:
    ktc = None
llm = LLM(model=str(default_model_folder()), enforce_eager=True, dtype="float32",
          max_model_len=1024, max_num_batched_tokens=1024, block_size=32,
          enable_prefix_caching=True, kv_cache_memory_bytes=128 << 20,
          gpu_memory_utilization=0.1, disable_log_stats=True, kv_transfer_config=ktc)
shared = [(17 * i) % 4000 + 100 for i in range(150)]
prompts = [shared + [(31 * i + k) % 4000 + 100 for i in range(40 + 9 * k)] for k in range(3)]
prompts.append(shared[:70])
params = SamplingParams(temperature=0, max_tokens=8)
runs = []
for _ in range(2):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    runs.append({"tokens": [list(o.outputs[0].token_ids) for o in outs],
                 "info": [o.kv_transfer_params or {} for o in outs]})
    assert llm.reset_prefix_cache()
print("RESULT " + json.dumps({"runs": runs}))
"""


def _claimed(run: dict[str, list[dict[str, dict[str, int]]]], key: str) -> list[int]:
    return [info[key].get("claimed_tokens", 0) for info in run["info"]]


def test_the_reference_and_the_real_connector_give_the_same_tokens(tmp_path: Path) -> None:
    alone: Any = _run(SCRIPT, str(tmp_path / "none"), "none")["runs"]
    reference: Any = _run(SCRIPT, str(tmp_path / "reference"), "reference")["runs"]
    real: Any = _run(SCRIPT, str(tmp_path / "agentcache"), "agentcache")["runs"]
    for runs in (reference, real):
        assert [r["tokens"] for r in runs] == [alone[0]["tokens"]] * 2
    # the second runs loaded the prefixes from the store (after what vLLM's own cache held
    # of the batch's earlier prompts), the same blocks with either connector
    assert sum(_claimed(reference[0], "reference")) == 0
    assert sum(_claimed(reference[1], "reference")) >= 160
    assert _claimed(real[1], "agentcache") == _claimed(reference[1], "reference")
