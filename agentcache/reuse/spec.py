"""Strategy specs: `name` or `name:key=value:key=value`, as the CLI, the bench and the vLLM
backend take them."""

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
        options: dict[str, Any] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ConfigError(f"strategy option {pair!r} in {text!r} is not key=value")
            options[key] = parse_value(value)
        try:  # here, not when the first engine is made after the model has loaded
            strategy(**options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"strategy {text.strip()!r}: {e}") from e
        label = name if not pairs else f"{name}:{':'.join(pairs)}"
        return cls(label, name, options)

    def build(self) -> ReuseStrategy:
        return STRATEGIES.get(self.name)(**self.options)


def parse_value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)
