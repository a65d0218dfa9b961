"""A structural check that a tool's parameters are a JSON Schema (draft 2020-12 keywords).

It checks the shape of every keyword it knows (types, sub-schemas, counts), recursively, and
names the path of the first problem. It does not validate instances against the schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentcache.errors import PromptError

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
SCHEMA_KEYS = ("additionalProperties", "additionalItems", "not", "contains", "propertyNames",
               "if", "then", "else", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LIST_KEYS = ("allOf", "anyOf", "oneOf", "prefixItems")
COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
              "minContains", "maxContains")  # fmt: skip
NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
STRING_KEYS = ("title", "description", "pattern", "format", "$ref", "$schema", "$id")


def _show(value: Any, limit: int = 80) -> str:
    """A client's value in an error message, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_tool_parameters(schema: Any, where: str) -> None:
    """Tool parameters: a JSON Schema describing an object."""
    validate_schema(schema, where)
    if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
        raise PromptError(f"{where}: must be a JSON Schema of type 'object'")


def validate_schema(schema: Any, path: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise PromptError(f"{path}: a JSON Schema is an object or a boolean, got {_show(schema)}")
    _check_type(schema.get("type"), path)
    for key in SCHEMA_KEYS:
        if key in schema:
            validate_schema(schema[key], f"{path}.{key}")
    for key in SCHEMA_MAP_KEYS:
        if key in schema:
            sub = schema[key]
            if not isinstance(sub, Mapping):
                raise PromptError(f"{path}.{key}: must map names to schemas, got {_show(sub)}")
            for name, s in sub.items():
                validate_schema(s, f"{path}.{key}.{name}")
    for key in SCHEMA_LIST_KEYS:
        if key in schema:
            _check_schema_list(schema[key], f"{path}.{key}")
    if "items" in schema:
        items = schema["items"]
        if isinstance(items, list):  # the pre-2020 tuple form
            _check_schema_list(items, f"{path}.items")
        else:
            validate_schema(items, f"{path}.items")
    _check_scalars(schema, path)


def _check_type(t: Any, path: str) -> None:
    names = t if isinstance(t, list) else [t] if t is not None else []
    if isinstance(t, list) and (not t or len(set(map(str, t))) != len(t)):
        raise PromptError(f"{path}.type: a list of types must be non-empty and unique")
    for name in names:
        if not isinstance(name, str) or name not in TYPES:
            raise PromptError(
                f"{path}.type: {_show(name)} is not a JSON Schema type; expected one of "
                f"{', '.join(sorted(TYPES))}"
            )


def _check_schema_list(items: Any, path: str) -> None:
    if not isinstance(items, list) or not items:
        raise PromptError(f"{path}: must be a non-empty list of schemas")
    for i, s in enumerate(items):
        validate_schema(s, f"{path}[{i}]")


def _check_scalars(schema: Mapping[str, Any], path: str) -> None:
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise PromptError(f"{path}.required: must be a list of property names")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise PromptError(f"{path}.enum: must be a list")
    for key in COUNT_KEYS:
        v = schema.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise PromptError(f"{path}.{key}: must be a non-negative integer, got {_show(v)}")
    for key in NUMBER_KEYS:  # present means a number (null included in what is refused)
        v = schema.get(key)
        if key in schema and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise PromptError(f"{path}.{key}: must be a number, got {_show(v)}")
    if "multipleOf" in schema and schema["multipleOf"] <= 0:
        raise PromptError(f"{path}.multipleOf: must be > 0")
    for key in STRING_KEYS:
        v = schema.get(key)
        if v is not None and not isinstance(v, str):
            raise PromptError(f"{path}.{key}: must be a string, got {_show(v)}")
