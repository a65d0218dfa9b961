"""Strategy specs: `name` or `name:key=value:key=value`, as the CLI, the bench and the vLLM
backend take them. Each value is read as the type its option declares
(`ReuseStrategy.option_types`), so every error is found here, before any model work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentcache.errors import ConfigError
from agentcache.reuse.base import STRATEGIES, ReuseStrategy

DEFAULT_STRATEGY = "rpdc"


@dataclass(frozen=True)
class StrategySpec:
    """`name` or `name:key=value:key=value` (options of that strategy)."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> StrategySpec:
        name, *pairs = text.strip().split(":")
        if name == "default":
            name = DEFAULT_STRATEGY
        strategy = STRATEGIES.get(name)  # unknown names list the known ones
        options = {key: value for key, value in (read_option(strategy, text, p) for p in pairs)}
        try:  # here, not when the first engine is made after the model has loaded
            strategy(**options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"strategy {text.strip()!r}: {e}") from e
        label = name if not pairs else f"{name}:{':'.join(pairs)}"
        return cls(label, name, options)

    def build(self) -> ReuseStrategy:
        return STRATEGIES.get(self.name)(**self.options)


def read_option(strategy: type[ReuseStrategy], text: str, pair: str) -> tuple[str, Any]:
    """One `key=value` of spec `text`, its value read as the option's declared type."""
    key, sep, value = pair.partition("=")
    if not sep:
        raise ConfigError(f"strategy option {pair!r} in {text!r} is not key=value")
    types = strategy.option_types()
    if not types:
        raise ConfigError(f"strategy {text.strip()!r}: {strategy.name} takes no options")
    if key not in types:
        raise ConfigError(
            f"strategy {text.strip()!r}: {strategy.name}: unknown options [{key!r}]; "
            f"known: {sorted(types)}"
        )
    try:
        return key, types[key].read(key, value)
    except ConfigError as e:
        raise ConfigError(f"strategy {text.strip()!r}: {e}") from None
