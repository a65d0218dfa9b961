from __future__ import annotations

import pytest

from agentcache.chat.messages import ToolSpec
from agentcache.chat.schema import validate_schema
from agentcache.chat.stream import TextStream
from agentcache.chat.tools import forced_call_prefix, parse_tool_calls, render_tools
from agentcache.errors import PromptError


def test_parse_tool_calls() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "src"}}\n</tool_call>'
    r = parse_tool_calls(text)
    assert r.content == "Let me look."
    assert [(c.name, dict(c.arguments)) for c in r.tool_calls] == [("ls", {"path": "src"})]
    assert r.tool_calls[0].id.startswith("call_")
    assert parse_tool_calls(text).tool_calls[0].id == r.tool_calls[0].id  # deterministic


def test_parse_two_calls_string_arguments_and_unterminated_last() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>\n{"name": "b", "arguments": {}}'
    )
    r = parse_tool_calls(text)
    assert [(c.name, dict(c.arguments)) for c in r.tool_calls] == [("a", {"x": 1}), ("b", {})]
    assert r.content == ""


# what a model may write: besides syntax errors, JSON that Python's parser refuses otherwise
LONG_INTEGER = '{"name": "a", "arguments": {"x": ' + "9" * 5000 + "}}"
LONG_INTEGER_IN_STRING = '{"name": "a", "arguments": "{\\"x\\": ' + "9" * 5000 + '}"}'
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "body",
    ['{"name": "a", "arguments": [1]}', "not json", '["a"]', LONG_INTEGER,
     LONG_INTEGER_IN_STRING, DEEP],
    ids=["array-arguments", "not-json", "array", "long-integer", "long-integer-in-string",
         "deep"],
)  # fmt: skip
def test_malformed_calls_are_reported_invalid(body: str) -> None:
    r = parse_tool_calls(f"ok <tool_call>{body}</tool_call>")
    assert r.tool_calls == () and len(r.invalid_tool_calls) == 1
    assert r.invalid_tool_calls[0].text == body
    assert "sys." not in r.invalid_tool_calls[0].error  # as the server's JSON errors read


def test_a_call_cut_inside_its_json_keeps_its_text() -> None:
    text = forced_call_prefix("ls") + '{"path": "sr'
    r = parse_tool_calls("Looking. " + text)
    assert r.content == "Looking. " + text and r.tool_calls == ()
    assert len(r.invalid_tool_calls) == 1


def test_no_call_is_all_content() -> None:
    assert parse_tool_calls("plain answer ").content == "plain answer "


def test_forced_prefix_parses_once_completed() -> None:
    text = forced_call_prefix("ls") + '{"path": "."}}\n</tool_call>'
    assert parse_tool_calls(text).tool_calls[0].name == "ls"


def test_render_tools_lists_each_tool_once() -> None:
    tools = [ToolSpec("a", "", {"type": "object"}), ToolSpec("b", "", {"type": "object"})]
    text = render_tools(tools)
    assert text.count('"type": "function"') == 2 and "<tools>" in text


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "objekt"}, "$.type"),
        ({"type": "object", "properties": []}, "$.properties"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "$.properties.a.type"),
        ({"type": "array", "items": 5}, "$.items"),
        ({"type": "object", "required": "a"}, "$.required"),
        ({"anyOf": []}, "$.anyOf"),
        ({"type": "string", "minLength": -1}, "$.minLength"),
        ("string", "$"),
    ],
)
def test_schema_errors_name_the_path(schema: object, where: str) -> None:
    with pytest.raises(PromptError) as err:
        validate_schema(schema, "$")
    assert str(err.value).startswith(where + ":")


def test_valid_schemas_pass() -> None:
    validate_schema(
        {"type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {
            "type": "array", "items": {"$ref": "#/$defs/x"}}}, "$defs": {"x": True},
         "required": ["a"], "additionalProperties": False},
        "$",
    )  # fmt: skip
    with pytest.raises(PromptError, match="type 'object'"):
        ToolSpec("f", "", {"type": "string"})


def test_text_stream_holds_back_markers_and_adds_up() -> None:
    chars = list("Hi there <tool_call>{}")
    stream = TextStream(lambda ids: "".join(chars[i] for i in ids), (), ("<tool_call>",))
    pieces = [stream.start()] + [stream.push(i) for i in range(len(chars))]
    assert "".join(pieces) == "Hi there"
    assert stream.finish("Hi there") == ""


def test_text_stream_stop_string_and_final_flush() -> None:
    text = "abc END more"
    stream = TextStream(lambda ids: "".join(text[i] for i in ids), ("END",), ())
    shown = "".join(stream.push(i) for i in range(len(text)))
    assert shown == "abc"
    assert shown + stream.finish("abc ") == "abc "
    assert stream.mismatches == 0


def test_text_stream_counts_a_final_text_that_does_not_extend_what_was_shown() -> None:
    pairs = ["ab", "c ", "de", "f"]
    stream = TextStream(lambda ids: "".join(pairs[i] for i in ids), (), ())
    shown = "".join(stream.push(i) for i in range(4))
    assert shown == "abc def"
    assert stream.finish("abX") == "" and stream.mismatches == 1
