"""`from agentcache import ...`: the curated names, the objects they stand for, and the laziness
that keeps `import agentcache` light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentcache
from agentcache import errors
from agentcache.model import loading
from agentcache.prompt import registry, segments, template
from agentcache.runtime import engine
from agentcache.session import AgentSession

API = {
    "Engine": engine.Engine,
    "EngineConfig": engine.EngineConfig,
    "GenerationParams": engine.GenerationParams,
    "AgentSession": AgentSession,
    "Segment": segments.Segment,
    "SegmentKind": segments.SegmentKind,
    "SegmentedPrompt": segments.SegmentedPrompt,
    "PromptTemplate": template.PromptTemplate,
    "load_template": registry.load_template,
    "load_model": loading.load_model,
}
ERRORS = {
    name: value
    for name, value in vars(errors).items()
    if isinstance(value, type) and issubclass(value, errors.AgentCacheError)
}


@pytest.mark.parametrize("name", sorted(API))
def test_each_name_is_the_object_it_stands_for(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from agentcache import {name}", namespace)
    assert namespace[name] is API[name]
    assert getattr(agentcache, name) is API[name]


def test_all_lists_the_api_and_every_error() -> None:
    assert len(ERRORS) >= 10
    assert set(agentcache.__all__) == {*API, *ERRORS, "__version__"}
    for name in ERRORS:
        assert getattr(agentcache, name) is ERRORS[name]
    assert set(agentcache.__all__) <= set(dir(agentcache))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Engin'"):
        agentcache.Engin  # noqa: B018
    with pytest.raises(ImportError, match="Engin"):
        exec("from agentcache import Engin", {})


def test_importing_the_package_loads_neither_torch_nor_the_runtime() -> None:
    check = (
        "import sys, agentcache, agentcache.errors; print(agentcache.__file__); "
        "print(sorted(m for m in ('torch', 'agentcache.runtime', 'jinja2') if m in sys.modules))"
    )
    root = str(Path(agentcache.__file__).parents[1])  # this checkout, not an installed copy
    env = {**os.environ, "PYTHONPATH": root}
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == [agentcache.__file__, "[]"]
