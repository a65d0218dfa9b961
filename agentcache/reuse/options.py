"""Typed strategy options: each option declares its type, and a spec's `key=value` text is read
as that type (`plan=true` stays the string "true"; `check_layer=none` becomes None).

The same table checks values given from Python (`EngineConfig.strategy_options`), so an
option of the wrong type is the same error from either side, naming the option and what it
accepts."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentcache.errors import ConfigError


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _bool(text: str) -> bool:
    words = {"true": True, "false": False}
    if text.lower() not in words:
        raise ValueError(text)
    return words[text.lower()]


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


@dataclass(frozen=True)
class OptionType:
    accepts: tuple[type, ...]  # Python types a value may have (bool is never an int here)
    words: str  # what it accepts, in words, for error messages
    parse: Callable[[str], Any]  # spec text -> value; ValueError when the text is not one

    def check(self, name: str, value: Any) -> None:
        ok = isinstance(value, self.accepts) and not (
            isinstance(value, bool) and bool not in self.accepts
        )
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise ConfigError(f"{name} must be {self.words}, got {value!r}")

    def read(self, name: str, text: str) -> Any:
        try:
            return self.parse(text)
        except ValueError:
            raise ConfigError(f"{name} must be {self.words}, got {text!r}") from None


# keyed by the annotation as written on the options dataclass
OPTION_TYPES: dict[str, OptionType] = {
    "int": OptionType((int,), "an integer", int),
    "int | None": OptionType((int, type(None)), "an integer or none", _optional_int),
    "float": OptionType((int, float), "a number", _float),
    "bool": OptionType((bool,), "true or false", _bool),
    "str": OptionType((str,), "a string", str),
}


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
