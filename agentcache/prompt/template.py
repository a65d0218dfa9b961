"""Typed prompt templates: a pydantic input model + a jinja2 template that renders segments.

A template marks segments with a block tag per segment:

    {% segment "system", id="sys", role="system" %}You are ...{% endsegment %}
    {% segment "update", id="obs", role="user" %}{{ observation }}{% endsegment %}

Text outside segment blocks must be whitespace. Undefined variables raise (StrictUndefined).
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Generic, TypeVar

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from pydantic import BaseModel, ValidationError

from agentcache.errors import PromptError
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind


def _marks() -> tuple[str, str]:
    """A template's segment delimiters in its rendered text. Each template draws its own, so
    that no input value can forge one (a value holding a delimiter, rendered outside any
    block, would otherwise open a segment of its own kind)."""
    nonce = secrets.token_hex(8)
    return f"\x00SEG:{nonce}\x00", f"\x00END:{nonce}\x00"


InputT = TypeVar("InputT", bound=BaseModel)


class _BlockError(PromptError):
    """A segment block that cannot render; `render` names the template and the line."""

    def __init__(self, lineno: int, message: str) -> None:
        super().__init__(message)
        self.lineno = lineno


class SegmentExtension(Extension):
    tags = {"segment"}  # noqa: RUF012  (jinja2's class attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        kind = parser.parse_expression()
        kwargs = []
        while parser.stream.skip_if("comma"):
            key = parser.stream.expect("name")
            if key.value not in ("id", "role"):
                parser.fail(f"segment takes id= and role=, not {key.value}=", key.lineno)
            parser.stream.expect("assign")
            kwargs.append(nodes.Keyword(key.value, parser.parse_expression()))
        body = parser.parse_statements(("name:endsegment",), drop_needle=True)
        call = self.call_method("_wrap", [kind, nodes.Const(lineno)], kwargs)
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _wrap(
        self, kind: str, lineno: int, caller: Any, id: str | None = None, role: str | None = None
    ) -> str:
        try:  # the kind and role, checked where the block is written
            Segment(SegmentKind.parse(kind), "", id, role)
        except PromptError as e:
            raise _BlockError(lineno, str(e)) from None
        text = caller()
        mark, end = self.environment.segment_marks  # type: ignore[attr-defined]
        if mark in text:
            raise _BlockError(lineno, "a segment block contains another one; segments cannot nest")
        header = json.dumps({"kind": kind, "id": id, "role": role})
        return f"{mark}{header}\n{text}{end}"


def _line(e: BaseException) -> str:
    """ " line N" for the template line an error was raised on (jinja2 rewrites the traceback
    so that the template's own frames carry its line numbers), or "" when none does."""
    tb, line = e.__traceback__, ""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = f" line {tb.tb_lineno}"
        tb = tb.tb_next
    return line


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        extensions=[SegmentExtension],
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.extend(segment_marks=_marks())
    return env


class PromptTemplate(Generic[InputT]):
    """Renders validated inputs to a `SegmentedPrompt`. Raises `PromptError` on bad templates,
    missing variables or text outside segments; pydantic's `ValidationError` on bad inputs."""

    def __init__(self, source: str, inputs: type[InputT], name: str = "template") -> None:
        self.name = name
        self.inputs = inputs
        env = _environment()
        self._marks: tuple[str, str] = env.segment_marks  # type: ignore[attr-defined]
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise PromptError(f"template {name!r} line {e.lineno}: {e.message}") from e
        except SyntaxError as e:  # what jinja2 compiles but Python refuses: `role=.., role=..`
            # (its line is in the compiled code, not the template's: not quoted)
            raise PromptError(f"template {name!r}: {e.msg}") from e

    def render(self, values: InputT | BaseModel | dict[str, Any]) -> SegmentedPrompt:
        if isinstance(values, self.inputs):
            model: BaseModel = values
        else:  # a dict, or another model's instance: validate it against this template's inputs
            data = values.model_dump() if isinstance(values, BaseModel) else values
            model = self.inputs.model_validate(data)
        try:
            text = self._template.render(**dict(model))
        except jinja2.UndefinedError as e:
            raise PromptError(
                f"template {self.name!r}{_line(e)} uses an undefined value: {e}"
            ) from e
        except _BlockError as e:
            raise PromptError(f"template {self.name!r} line {e.lineno}: {e}") from e
        except PromptError as e:
            raise PromptError(f"template {self.name!r}: {e}") from e
        except Exception as e:  # an expression that fails: {{ 1 / n }}, {{ x.method() }}, ...
            raise PromptError(f"template {self.name!r}{_line(e)}: {type(e).__name__}: {e}") from e
        return SegmentedPrompt(self._split(text))

    def _split(self, text: str) -> list[Segment]:
        segments: list[Segment] = []
        mark, end = self._marks
        for chunk in text.split(mark):
            body, _, outside = chunk.rpartition(end) if end in chunk else ("", "", chunk)
            if outside.strip():
                raise PromptError(
                    f"template {self.name!r} has text outside any segment: {outside.strip()[:60]!r}"
                )
            if body:
                header, _, seg_text = body.partition("\n")
                meta = json.loads(header)
                segments.append(
                    Segment(SegmentKind(meta["kind"]), seg_text, meta["id"], meta["role"])
                )
        return segments


__all__ = ["PromptTemplate", "ValidationError"]
