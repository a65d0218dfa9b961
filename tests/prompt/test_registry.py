from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from pydantic import BaseModel

from agentcache.errors import ConfigError, PromptError, UnknownStrategyError
from agentcache.prompt import registry
from agentcache.prompt.registry import (
    PROVIDER_GROUP,
    SHIPPED_PROVIDER,
    TEMPLATES,
    TemplateRegistry,
    TemplateSource,
    load_template,
)
from agentcache.prompt.segments import SegmentKind

PACKAGE = "greeting_templates"  # written by the `provider` fixture
PROVIDER = f"{PACKAGE}:SOURCES"
GREETING = '{% segment "system", id="sys", role="system" %}Greet {{ who }}.{% endsegment %}\n'
PROVIDER_INIT = """
from pydantic import BaseModel
from agentcache.prompt.registry import TemplateSource

class GreetingInputs(BaseModel):
    who: str

SOURCES = (TemplateSource("greeting", GreetingInputs, __name__),)
NOT_SOURCES = ("greeting",)
"""


class Inputs(BaseModel):
    who: str


@pytest.fixture
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed package providing one template, `greeting`."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text(PROVIDER_INIT)
    (package / "greeting.j2").write_text(GREETING)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PROVIDER
    sys.modules.pop(PACKAGE, None)


def test_shipped_templates_come_from_the_templates_package() -> None:
    assert TEMPLATES.names() == ["memgpt", "reflexion", "swe_agent"]
    source = TEMPLATES.get("swe_agent")
    assert source.package == "agentcache_templates"
    assert source.inputs.__module__ == "agentcache_templates.inputs"
    assert '{% segment "fixed", id="instance"' in source.text()
    assert load_template("swe_agent").inputs is source.inputs


def test_a_provider_adds_templates_next_to_the_shipped_ones(provider: str) -> None:
    templates = TemplateRegistry(lambda: [SHIPPED_PROVIDER, provider])
    assert templates.names() == ["greeting", "memgpt", "reflexion", "swe_agent"]
    prompt = templates.get("greeting").load().render({"who": "Ada"})
    assert [(s.kind, s.id, s.text) for s in prompt.segments] == [
        (SegmentKind.SYSTEM, "sys", "Greet Ada.")
    ]


def test_entry_points_name_the_providers(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    found = [EntryPoint("greeting", provider, PROVIDER_GROUP)]
    groups: list[str] = []

    def entry_points(group: str) -> list[EntryPoint]:
        groups.append(group)
        return found

    monkeypatch.setattr(registry, "entry_points", entry_points)
    assert registry.installed_providers() == [SHIPPED_PROVIDER, provider]
    assert groups == [PROVIDER_GROUP]
    assert "greeting" in TemplateRegistry().names()


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("no_such_templates:SOURCES", "No module named 'no_such_templates'"),
        (f"{PACKAGE}:MISSING", "has no attribute 'MISSING'"),
        (f"{PACKAGE}:NOT_SOURCES", "is not a sequence of TemplateSource"),
    ],
)
def test_a_provider_that_cannot_load_is_an_error_naming_it(
    provider: str, ref: str, problem: str
) -> None:
    calls: list[int] = []

    def providers() -> list[str]:
        calls.append(1)
        return [ref]

    templates = TemplateRegistry(providers)
    for _ in range(2):  # a failed load is not remembered as loaded
        with pytest.raises(PromptError, match=problem) as e:
            templates.get("greeting")
        assert repr(ref) in str(e.value)
    assert len(calls) == 2


def test_register_in_process_and_twice() -> None:
    templates = TemplateRegistry(list)
    source = TemplateSource("greeting", Inputs, "tests")
    assert templates.register(source) is source
    assert templates.register(TemplateSource("greeting", Inputs, "tests")) is source  # again
    with pytest.raises(ConfigError, match="'greeting' registered twice: by tests and other"):
        templates.register(TemplateSource("greeting", Inputs, "other"))
    assert templates.get("greeting") is source


def test_unknown_name_lists_the_known_ones() -> None:
    templates = TemplateRegistry(lambda: [SHIPPED_PROVIDER])
    with pytest.raises(UnknownStrategyError, match="unknown template 'memgtp'; known: memgpt, "):
        templates.get("memgtp")
