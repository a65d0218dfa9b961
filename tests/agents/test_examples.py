"""The scripts in examples/ run end to end: each on the tiny model instead of the default one."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

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
