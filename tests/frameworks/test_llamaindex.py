"""LlamaIndex's `FunctionAgent` on `OpenAILike` (chat completions, streamed, tools marked
`strict`), two runs of one conversation carried in a `Memory`. LlamaIndex needs `openai<3`,
which the main venv cannot hold beside the Agents SDK's `openai>=3`, so the loop runs in a venv
of its own (`make llamaindex`, which `make test` builds first): `llamaindex_client.py` runs it
against one server and prints the transcript, with the usage of every reply as the agent
received it. Each step's tool is named by the client's LLM (`get_temperature`, then
`to_fahrenheit`, then `"none"` for the answer)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import MODEL, STRATEGIES, Servers, assert_warm_steps_reuse
from tests.frameworks.task import FOLLOW_UP, QUESTION, get_temperature, to_fahrenheit

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-llamaindex"  # the Makefile's LI_VENV
CLIENT = Path(__file__).with_name("llamaindex_client.py")
TOOLS: dict[str, Callable[..., str]] = {
    "get_temperature": get_temperature,
    "to_fahrenheit": to_fahrenheit,
}

if not (VENV / ".installed").exists():
    pytest.skip(f"needs {VENV.name} (`make llamaindex`; `make test` builds it first)",
                allow_module_level=True)  # fmt: skip

pytestmark = pytest.mark.slow


def run(base_url: str) -> dict[str, Any]:
    cmd = [str(VENV / "bin" / "python"), str(CLIENT), "--base-url", base_url, "--model", MODEL]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    transcript: dict[str, Any] = json.loads(done.stdout)
    return transcript


def said(transcript: dict[str, Any]) -> list[Any]:
    """The transcript without the usage: what the model and the tools said."""
    return [{**t, "steps": [{k: v for k, v in s.items() if k != "usage"} for s in t["steps"]]}
            for t in transcript["turns"]]  # fmt: skip


def steps(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for t in transcript["turns"] for s in t["steps"]]


def test_function_agent_matches_full_and_reuses(servers: Servers) -> None:
    runs = {s: run(servers[s].base_url) for s in STRATEGIES}
    assert said(runs["default"]) == said(runs["full"])
    turns = runs["default"]["turns"]
    assert [t["question"] for t in turns] == [QUESTION, FOLLOW_UP]
    for t in turns:  # each run: the two forced calls, their results, then a text answer
        calls = [c["tool"] for s in t["steps"] for c in s["tool_calls"]]
        assert calls == ["get_temperature", "to_fahrenheit"], t
        assert len(t["steps"]) == 3 and t["answer"] == t["steps"][-1]["content"], t
        # the loop ran the tools on the model's arguments and sent back what they returned
        assert [r["output"] for r in t["tool_results"]] == [
            TOOLS[r["tool"]](**r["kwargs"]) for r in t["tool_results"]
        ]
    usage = {s: [st["usage"] for st in steps(runs[s])] for s in STRATEGIES}
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usage["default"]]
    prompts = [u["prompt_tokens"] for u in usage["default"]]
    assert_warm_steps_reuse(cached, prompts)
    # the follow-up resends the first run's conversation, found whole in the cache
    assert cached[3] >= prompts[2], (cached, prompts)
    assert all(u["prompt_tokens_details"]["cached_tokens"] == 0 for u in usage["full"])
