"""Function calls written as text: `name(arg="value", other=3)`, one per line, as the memgpt
template documents them. Parsed with Python's own parser, never evaluated."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

CALL_LINE = re.compile(r"\b([a-z_][a-z0-9_]*)\((.*)\)", re.IGNORECASE)


@dataclass(frozen=True)
class Call:
    name: str
    args: dict[str, Any]

    def render(self) -> str:
        args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in self.args.items())
        return f"{self.name}({args})"


def parse_calls(text: str, known: set[str]) -> list[Call]:
    """Every well-formed call of a `known` function, in order. Arguments must be keyword
    literals; anything else on the line makes that line not a call."""
    calls = []
    for line in text.splitlines():
        m = CALL_LINE.search(line)
        if m is None or m.group(1) not in known:
            continue
        try:
            node = ast.parse(f"f({m.group(2)})", mode="eval").body
            if not isinstance(node, ast.Call) or node.args:
                continue
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        except (SyntaxError, ValueError):
            continue
        calls.append(Call(m.group(1), args))
    return calls
