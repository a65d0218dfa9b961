"""Named templates: the registry `load_template` resolves names through.

agentcache holds the mechanism (`PromptTemplate`); templates live in packages that provide
them. A provider is a `"module:attribute"` reference to a sequence of `TemplateSource`s:

    agentcache_templates:SOURCES     shipped in the same wheel (reflexion, memgpt, swe_agent)
    <entry points in the group "agentcache.templates">   any installed package's own

so a package ships templates by naming its sources in its metadata:

    [project.entry-points."agentcache.templates"]
    mine = "my_package.templates:SOURCES"

Providers are loaded the first time a name is looked up. One that cannot be loaded is a
`PromptError` naming it, never a silently shorter list. `register` adds a source in-process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from agentcache.errors import ConfigError, PromptError, UnknownStrategyError
from agentcache.prompt.template import PromptTemplate

PROVIDER_GROUP = "agentcache.templates"
SHIPPED_PROVIDER = "agentcache_templates:SOURCES"


@dataclass(frozen=True)
class TemplateSource:
    """A named template: the file `<name>.j2` in package `package`, rendered from `inputs`."""

    name: str
    inputs: type[BaseModel]
    package: str

    def text(self) -> str:
        return resources.files(self.package).joinpath(f"{self.name}.j2").read_text("utf-8")

    def load(self) -> PromptTemplate[Any]:
        return PromptTemplate(self.text(), self.inputs, name=self.name)


def installed_providers() -> list[str]:
    """The shipped provider, then every one named under the entry-point group."""
    return [SHIPPED_PROVIDER, *(ep.value for ep in entry_points(group=PROVIDER_GROUP))]


def load_provider(ref: str) -> tuple[TemplateSource, ...]:
    """The sources a `"module:attribute"` reference names. Raises `PromptError` naming `ref`
    when the module does not import or the attribute is not a sequence of `TemplateSource`."""
    module, _, attribute = ref.partition(":")
    try:
        sources = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise PromptError(f"template provider {ref!r} cannot be loaded: {e}") from e
    if not isinstance(sources, list | tuple) or not all(
        isinstance(s, TemplateSource) for s in sources
    ):
        raise PromptError(f"template provider {ref!r} is not a sequence of TemplateSource")
    return tuple(sources)


class TemplateRegistry:
    """Name -> `TemplateSource`. Registering a name again with a different source is a
    `ConfigError`; an unknown name is an `UnknownStrategyError` listing the known ones. The
    providers are loaded once, at the first lookup; a failed load raises and is retried."""

    def __init__(self, providers: Callable[[], list[str]] = installed_providers) -> None:
        self._providers = providers
        self._sources: dict[str, TemplateSource] = {}
        self._loaded = False

    def register(self, source: TemplateSource) -> TemplateSource:
        known = self._sources.setdefault(source.name, source)
        if known != source:
            raise ConfigError(
                f"template {source.name!r} registered twice: by {known.package} and "
                f"{source.package}"
            )
        return known

    def get(self, name: str) -> TemplateSource:
        self._load_providers()
        if name not in self._sources:
            raise UnknownStrategyError("template", name, list(self._sources))
        return self._sources[name]

    def names(self) -> list[str]:
        self._load_providers()
        return sorted(self._sources)

    def _load_providers(self) -> None:
        if self._loaded:
            return
        for ref in self._providers():
            for source in load_provider(ref):
                self.register(source)
        self._loaded = True


TEMPLATES = TemplateRegistry()


def load_template(name: str) -> PromptTemplate[Any]:
    """The registered template `name` (shipped: reflexion, memgpt, swe_agent). Raises
    `UnknownStrategyError` (an `AgentCacheError`) for an unknown name, listing the known ones."""
    return TEMPLATES.get(name).load()
