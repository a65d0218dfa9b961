"""The configuration dataclasses' plain fields, checked against their declared types when one
is made (`check_field_types`): from Python, `kv_pages="8"`, `request_timeout_s=None` or
`fsync="no"` is a ConfigError naming the field, not a comparison's TypeError later or a flag
silently read as true. A bool is not a number here, and NaN is not one either. Fields of other
types (a Path, a nested config, a mapping of options) are checked by their class's own rules."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from agentcache.errors import ConfigError

NONE = type(None)
# the annotation as written (`from __future__ import annotations` keeps it a string) ->
# (types a value may have, what that is in words)
PLAIN: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "a whole number"),
    "int | None": ((int, NONE), "a whole number or None"),
    "float": ((int, float), "a number"),
    "float | None": ((int, float, NONE), "a number or None"),
    "bool": ((bool,), "True or False"),
    "str": ((str,), "a string"),
    "str | None": ((str, NONE), "a string or None"),
    "bytes | None": ((bytes, NONE), "bytes or None"),
    "frozenset[str]": ((frozenset,), "a frozenset of strings"),
    "frozenset[str] | None": ((frozenset, NONE), "a frozenset of strings or None"),
}


def check_field_types(obj: Any) -> None:
    """ConfigError naming the first plain field of dataclass `obj` whose value is not of its
    declared type."""
    for f in dataclasses.fields(obj):
        plain = PLAIN.get(str(f.type))
        if plain is None:
            continue
        kinds, words = plain
        value = getattr(obj, f.name)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok or (isinstance(value, float) and math.isnan(value)):
            raise ConfigError(f"{f.name} must be {words}, got {value!r:.60}")
