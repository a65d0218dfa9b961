"""Schemas for structured-output checks (tests/server/test_structured.py) and the decode-cost
bench (benchmarks/server/structured_cost.py): nested objects, enums, arrays, optional fields,
unions, nullable and bounded values. Every string, array and number is bounded so that a reply
fits a small max_tokens whatever the model writes inside the grammar.

`validate` checks an instance against the keywords these schemas use (a reference that needs
no third-party validator); it returns the first problem's path, or None.
"""

from __future__ import annotations

from typing import Any

S: dict[str, Any] = {"type": "string", "maxLength": 8}
INT: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": 999}
NUM: dict[str, Any] = {"type": "number", "minimum": -10, "maximum": 10}
BOOL: dict[str, Any] = {"type": "boolean"}


def obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    """An object with `props`, all required unless `required` names the required ones."""
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": list(props) if required is None else required}  # fmt: skip


def arr(items: Any, max_items: int = 3, min_items: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_items}


def enum(*values: Any) -> dict[str, Any]:
    return {"enum": list(values)}


SCHEMAS: dict[str, dict[str, Any]] = {
    "flat-string": obj(name=S),
    "flat-int": obj(count=INT),
    "flat-number": obj(score=NUM),
    "flat-bool": obj(ok=BOOL),
    "flat-mixed": obj(name=S, age=INT, active=BOOL),
    "enum-string": obj(color=enum("red", "green", "blue")),
    "enum-typed": obj(level={"type": "string", "enum": ["low", "mid", "high"]}),
    "enum-mixed": obj(value=enum(1, "two", None, True)),
    "const": obj(kind={"const": "event"}, id=INT),
    "optional-one": obj(["name"], name=S, nickname=S),
    "optional-all": obj([], a=S, b=INT),
    "optional-nested": obj(["id"], id=INT, meta=obj([], tag=S)),
    "nested-2": obj(user=obj(name=S, id=INT)),
    "nested-3": obj(a=obj(b=obj(c=INT))),
    "nested-siblings": obj(src=obj(path=S), dst=obj(path=S, overwrite=BOOL)),
    "array-strings": obj(tags=arr(S)),
    "array-ints": obj(values=arr(INT, 4)),
    "array-enum": obj(days=arr(enum("mon", "tue", "wed"), 3)),
    "array-objects": obj(items=arr(obj(sku=S, qty=INT), 2)),
    "array-nonempty": obj(steps=arr(S, 2, 1)),
    "array-nested": obj(grid=arr(arr(INT, 2), 2)),
    "tuple-prefix": obj(
        point={"type": "array", "prefixItems": [INT, INT], "items": False, "minItems": 2}
    ),
    "nullable-type": obj(note={"type": ["string", "null"], "maxLength": 8}),
    "anyof-scalar": obj(id={"anyOf": [INT, S]}),
    "anyof-object": obj(
        shape={
            "anyOf": [obj(kind={"const": "circle"}, r=INT), obj(kind={"const": "square"}, side=INT)]
        }
    ),
    "string-pattern": obj(code={"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    "string-minmax": obj(word={"type": "string", "minLength": 2, "maxLength": 5}),
    "int-range": obj(month={"type": "integer", "minimum": 1, "maximum": 12}),
    "tool-args": obj(["path"], path=S, recursive=BOOL, depth=INT),
    "agent-step": obj(
        thought=S, action=enum("search", "open", "finish"), args=obj([], query=S, url=S)
    ),
    "extraction": obj(people=arr(obj(["name"], name=S, age=INT), 2), place=S),
    "defs-ref": {
        "$defs": {"item": obj(id=INT)},
        **obj(first={"$ref": "#/$defs/item"}, rest=arr({"$ref": "#/$defs/item"}, 2)),
    },
    "root-array": arr(obj(k=S), 2),
    "root-enum": enum("yes", "no"),
}

JSON_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
}  # fmt: skip


def _type_ok(value: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, JSON_TYPES[t])


def validate(value: Any, schema: Any, root: Any = None, path: str = "$") -> str | None:
    """The first problem of `value` against `schema` (the keywords above), or None."""
    root = schema if root is None else root
    if schema is True:
        return None
    if schema is False:
        return f"{path}: no value is allowed here"
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return validate(value, target, root, path)
    if "anyOf" in schema and all(validate(value, s, root, path) for s in schema["anyOf"]):
        return f"{path}: matches no anyOf branch"
    if "const" in schema and value != schema["const"]:
        return f"{path}: is not {schema['const']!r}"
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return f"{path}: {value!r} not in enum"
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not any(_type_ok(value, t) for t in names):
            return f"{path}: {value!r} is not of type {types}"
    return (
        _object(value, schema, root, path)
        or _array(value, schema, root, path)
        or _scalar(value, schema, path)
    )


def _object(value: Any, schema: Any, root: Any, path: str) -> str | None:
    if not isinstance(value, dict):
        return None
    props = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing {name!r}"
    for name, v in value.items():
        if name in props:
            if problem := validate(v, props[name], root, f"{path}.{name}"):
                return problem
        elif schema.get("additionalProperties", True) is False:
            return f"{path}: unexpected property {name!r}"
    return None


def _array(value: Any, schema: Any, root: Any, path: str) -> str | None:
    if not isinstance(value, list):
        return None
    if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
        return f"{path}: {len(value)} items out of bounds"
    prefix = schema.get("prefixItems", [])
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items", True)
        if problem := validate(v, sub, root, f"{path}[{i}]"):
            return problem
    return None


def _scalar(value: Any, schema: Any, path: str) -> str | None:
    import re

    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            return f"{path}: length {len(value)} out of bounds"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{path}: does not match {schema['pattern']!r}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: below minimum"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: above maximum"
    return None
