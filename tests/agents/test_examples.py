"""The scripts in examples/ run end to end: each on the tiny model instead of the default one."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import agentcache
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "title", "last_line"),
    [
        ("reflexion_agent", "Reflexion on tiny-llama", "trial 1: answer"),
        ("memgpt_agent", "MemGPT-style agent on tiny-llama", "core memory 'human'"),
        ("swe_agent", "SWE-style agent on tiny-llama", "submitted:"),
    ],
    ids=["reflexion", "memgpt", "swe_agent"],
)
def test_example_runs_and_prints_every_call(
    name: str,
    title: str,
    last_line: str,
    tiny: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = load_example(name)
    args = argparse.Namespace(model=None, strategy="rpdc", threads=None, cache_dir=None)
    monkeypatch.setattr(module, "example_args", lambda description: args)
    monkeypatch.setattr(module, "example_engine", lambda a: Engine(tiny, EngineConfig()))
    module.main()
    out = capsys.readouterr().out
    assert title in out and "(rpdc)" in out
    assert "model calls; turns 2+ reused" in out
    assert last_line in out


def readme_block(section: str) -> str:
    """The first python block under README's `## <section>` heading."""
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    body = readme.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return body.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_use_it_runs_on_the_public_api(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = readme_block("Use it")
    imports = [line for line in code.splitlines() if "import" in line]
    assert imports and all(line.startswith("from agentcache import ") for line in imports)
    monkeypatch.setattr(agentcache, "load_model", lambda: tiny)
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    first, second = namespace["session"].turns[0], namespace["swe"].turns[0]
    assert capsys.readouterr().out.startswith(first.text)
    assert first.stats.prompt_tokens > 0 and len(first.token_ids) <= 48
    assert [s.id for s in namespace["swe"].prompt_for({"task": "t"}).segments][:2] == [
        "sys",
        "instance",
    ]
    assert second.stats.prompt_tokens > first.stats.prompt_tokens


def test_quickstart_reuses_the_shifted_history(
    tiny: LoadedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    session = load_example("quickstart").main(Engine(tiny, EngineConfig()))
    first, second = (t.stats for t in session.turns)
    assert first.reused_tokens == 0 < second.reused_tokens and not second.misses
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"turn 2: {second.prompt_tokens} prompt tokens, ")
    assert f"{second.reused_tokens} reused, {second.recomputed_tokens} recomputed" in lines[1]
