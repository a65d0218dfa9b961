from __future__ import annotations

from collections.abc import Mapping

import pytest

from agentcache.model import loading
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache_agents import SWEAgent, SWETask


def check(files: Mapping[str, str]) -> tuple[bool, str]:
    ok = "return a + b" in files["calc.py"]
    return ok, "1 passed" if ok else "1 failed"


@pytest.mark.slow
def test_swe_loop_on_the_default_model_reuses_every_earlier_step() -> None:
    engine = Engine(loading.load_model(), EngineConfig(kv_pages=512))
    files = {"calc.py": "def add(a, b):\n    return a - b\n"}
    task = SWETask("Fix add() in calc.py.", files, check)
    agent = SWEAgent(engine, max_steps=3, max_new_tokens=24)
    result = agent.run(task)
    assert result.steps == len(agent.records) <= 3
    assert agent.num_fallbacks == sum(r.fallback is not None for r in agent.records)
    for r in agent.records[1:]:
        assert r.reused_tokens > 0 and not r.misses  # system, task and every earlier step hit
