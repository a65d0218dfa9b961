"""Every bad input gets a 4xx with an OpenAI error body naming what is wrong: no traceback, no
5xx, nothing silently accepted. In-process (ASGI) against a tiny random model, with small
limits so each one is cheap to exceed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.server.limits import blank_strings, nonfinite_number
from tests.server.conftest import MODEL

URL = "/v1/chat/completions"
GOOD: dict[str, Any] = {
    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
}  # fmt: skip
USER = {"role": "user", "content": "hi"}


def tool(parameters: Any = None, **function: Any) -> dict[str, Any]:
    fn = {"name": "f", **function}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def params(**schema: Any) -> dict[str, Any]:
    """A tool schema of type object with one property `a` described by `schema`."""
    return {"type": "object", "properties": {"a": schema}}


def call(**function: Any) -> dict[str, Any]:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                "function": function}]}  # fmt: skip


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


V, T, L = "invalid_value", "invalid_tool_schema", "limit_exceeded"
# (id, fields merged into GOOD, status, code, param, words the message must contain)
CASES: list[tuple[str, dict[str, Any], int, str, str | None, str]] = [
    # the request's own fields
    ("model-missing", {"model": None}, 400, V, "model", "model"),
    ("model-number", {"model": 5}, 400, V, "model", "valid string"),
    ("model-unknown", {"model": "gpt-9"}, 404, "model_not_found", "model", "gpt-9"),
    ("messages-empty", {"messages": []}, 400, V, "messages", "at least 1"),
    ("messages-object", {"messages": {"role": "user"}}, 400, V, "messages", "valid list"),
    ("messages-null", {"messages": None}, 400, V, "messages", "valid list"),
    ("message-number", {"messages": [5]}, 400, V, "messages.0", "messages.0"),
    ("message-no-role", {"messages": [{"content": "x"}]}, 400, V, "messages.0.role",
     "Field required"),
    ("message-role-unknown", {"messages": [{"role": "wizard", "content": "x"}]}, 400, V,
     "messages.0.role", "wizard"),
    ("message-role-number", {"messages": [{"role": 1, "content": "x"}]}, 400, V,
     "messages.0.role", "messages.0.role"),
    ("content-number", {"messages": [{"role": "user", "content": 5}]}, 400, V,
     "messages.0.content", "valid string"),
    ("content-image", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     V, "messages", "only text parts"),
    ("content-part-string", {"messages": [{"role": "user", "content": ["x"]}]}, 400, V,
     "messages.0.content.0", "valid dictionary"),
    ("content-text-number", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]}, 400, V, "messages", "'text' must be a string"),
    ("content-surrogate", {"messages": [{"role": "user", "content": "a\ud800"}]}, 400, V,
     "messages.0.content", "not valid Unicode"),
    ("tool-call-args-lone-surrogate", {"messages": [call(name="f", arguments="\ud800")]}, 400,
     V, "messages.0.tool_calls.0.function.arguments", "not valid Unicode"),
    ("key-lone-surrogate", {"metadata": {"\udc00": "x"}}, 400, V, "metadata.\\udc00",
     "not valid Unicode"),
    ("name-number", {"messages": [{"role": "user", "content": "x", "name": 5}]}, 400, V,
     "messages.0.name", "valid string"),
    ("tool-call-id-number", {"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]},
     400, V, "messages.0.tool_call_id", "valid string"),
    ("tool-calls-object", {"messages": [{"role": "assistant", "tool_calls": {"a": 1}}]}, 400, V,
     "messages.0.tool_calls", "valid list"),
    ("tool-call-no-function", {"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]},
     400, V, "messages.0.tool_calls.0.function", "Field required"),
    ("tool-call-type", {"messages": [{"role": "assistant", "tool_calls": [{"type": "x",
     "function": {"name": "f"}}]}]}, 400, V, "messages.0.tool_calls.0.type", "'function'"),
    ("tool-call-no-name", {"messages": [call(arguments="{}")]}, 400, V,
     "messages.0.tool_calls.0.function.name", "Field required"),
    ("tool-call-args-invalid", {"messages": [call(name="f", arguments="{nope")]}, 400, V,
     "messages", "not valid JSON"),
    ("tool-call-args-array", {"messages": [call(name="f", arguments="[1, 2]")]}, 400, V,
     "messages", "must be a JSON object"),
    ("tool-call-args-number", {"messages": [call(name="f", arguments=5)]}, 400, V,
     "messages.0.tool_calls.0.function.arguments", "arguments"),
    ("tool-call-args-surrogate", {"messages": [call(name="f", arguments='{"a": "\\ud800"}')]},
     400, V, "messages", "not valid Unicode"),
    # numbers and switches: strict types, ranges
    ("max-tokens-string", {"max_tokens": "5"}, 400, V, "max_tokens", "valid integer"),
    ("max-tokens-bool", {"max_tokens": True}, 400, V, "max_tokens", "valid integer"),
    ("max-tokens-negative", {"max_tokens": -1}, 400, V, "max_tokens", "greater than or equal"),
    ("max-tokens-float", {"max_tokens": 2.5}, 400, V, "max_tokens", "valid integer"),
    ("max-tokens-huge", {"max_tokens": 10**9}, 400, "context_length_exceeded", "max_tokens",
     "prompt + max_tokens is 1000000052 tokens"),
    ("max-completion-negative", {"max_completion_tokens": -3}, 400, V, "max_completion_tokens",
     "greater than or equal"),
    ("temperature-string", {"temperature": "0"}, 400, V, "temperature", "valid number"),
    ("temperature-negative", {"temperature": -1}, 400, V, "temperature", "greater than or equal"),
    ("temperature-over-2", {"temperature": 3}, 400, V, "temperature", "less than or equal"),
    ("temperature-bool", {"temperature": True}, 400, V, "temperature", "valid number"),
    ("top-p-zero", {"top_p": 0}, 400, V, "top_p", "greater than 0"),
    ("top-p-over-1", {"top_p": 1.5}, 400, V, "top_p", "less than or equal"),
    ("top-p-string", {"top_p": "1"}, 400, V, "top_p", "valid number"),
    ("n-two", {"n": 2}, 400, V, "n", "less than or equal to 1"),
    ("n-zero", {"n": 0}, 400, V, "n", "greater than or equal to 1"),
    ("stream-string", {"stream": "yes"}, 400, V, "stream", "valid bool"),
    ("stream-number", {"stream": 1}, 400, V, "stream", "valid bool"),
    ("stream-options-string", {"stream_options": "usage"}, 400, V, "stream_options",
     "stream_options"),
    ("include-usage-string", {"stream_options": {"include_usage": "yes"}}, 400, V,
     "stream_options.include_usage", "valid bool"),
    ("seed-string", {"seed": "1"}, 400, V, "seed", "valid integer"),
    ("seed-too-big", {"seed": 2**70}, 400, V, "seed", "less than"),
    ("seed-float", {"seed": 1.5}, 400, V, "seed", "valid integer"),
    # strings the server keeps or compares: bounded
    ("stop-empty", {"stop": ""}, 400, V, "stop", "at least 1"),
    ("stop-list-empty-string", {"stop": ["x", ""]}, 400, V, "stop.1", "at least 1"),
    ("stop-number", {"stop": [1]}, 400, V, "stop.0", "valid string"),
    ("stop-too-many", {"stop": ["a", "b", "c", "d", "e"]}, 400, L, "stop", "--max-stop 4"),
    ("stop-too-long", {"stop": ["x" * 33]}, 400, L, "stop", "--max-stop-chars 32"),
    ("user-too-long", {"user": "u" * 65}, 400, L, "user", "--max-user-chars 64"),
    ("user-number", {"user": 5}, 400, V, "user", "valid string"),
    ("cache-salt-empty", {"cache_salt": ""}, 400, V, "cache_salt", "at least 1"),
    ("cache-salt-long", {"cache_salt": "s" * 257}, 400, V, "cache_salt", "at most 256"),
    ("cache-salt-number", {"cache_salt": 7}, 400, V, "cache_salt", "valid string"),
    ("cache-key-empty", {"prompt_cache_key": ""}, 400, V, "prompt_cache_key", "at least 1"),
    ("cache-key-long", {"prompt_cache_key": "k" * 257}, 400, V, "prompt_cache_key",
     "at most 256"),
    ("cache-key-number", {"prompt_cache_key": 7}, 400, V, "prompt_cache_key", "valid string"),
    ("cache-key-object", {"prompt_cache_key": {"a": 1}}, 400, V, "prompt_cache_key",
     "valid string"),
    ("too-many-messages", {"messages": [USER] * 17}, 400, L, "messages", "--max-messages 16"),
    ("too-much-content", {"messages": [{"role": "user", "content": "x" * 2001}]}, 400, L,
     "messages", "--max-content-chars 2000"),
    ("too-much-in-tool-args", {"messages": [call(name="f", arguments=json.dumps(
        {"a": "x" * 2001}))]}, 400, L, "messages", "--max-content-chars 2000"),
    ("too-many-tools", {"tools": [tool()] * 5}, 400, L, "tools", "--max-tools 4"),
    # tools
    ("tools-object", {"tools": {"a": 1}}, 400, V, "tools", "valid list"),
    ("tool-type", {"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, 400, V,
     "tools.0.type", "'function'"),
    ("tool-no-function", {"tools": [{"type": "function"}]}, 400, V, "tools.0.function",
     "Field required"),
    ("tool-name-empty", {"tools": [tool(name="")]}, 400, V, "tools.0.function.name",
     "at least 1"),
    ("tool-name-number", {"tools": [tool(name=5)]}, 400, V, "tools.0.function.name",
     "valid string"),
    ("schema-type-unknown", {"tools": [tool({"type": "objekt"})]}, 400, T, "tools[0]", "objekt"),
    ("schema-type-object", {"tools": [tool({"type": {"a": 1}})]}, 400, T, "tools[0]",
     "is not a JSON Schema type"),
    ("schema-type-nested-list", {"tools": [tool(params(type=[["string"]]))]}, 400, T,
     "tools[0]", "properties.a.type"),
    ("schema-type-empty-list", {"tools": [tool(params(type=[]))]}, 400, T, "tools[0]",
     "non-empty and unique"),
    ("schema-type-duplicates", {"tools": [tool(params(type=["string", "string"]))]}, 400, T,
     "tools[0]", "non-empty and unique"),
    ("schema-not-object-type", {"tools": [tool({"type": "string"})]}, 400, T, "tools[0]",
     "of type 'object'"),
    ("schema-a-string", {"tools": [tool("object")]}, 400, T, "tools[0]", "object or a boolean"),
    ("schema-multipleof-null", {"tools": [tool(params(multipleOf=None))]}, 400, T, "tools[0]",
     "multipleOf: must be a number"),
    ("schema-multipleof-zero", {"tools": [tool(params(multipleOf=0))]}, 400, T, "tools[0]",
     "multipleOf: must be > 0"),
    ("schema-multipleof-string", {"tools": [tool(params(multipleOf="2"))]}, 400, T, "tools[0]",
     "multipleOf: must be a number"),
    ("schema-minimum-null", {"tools": [tool(params(minimum=None))]}, 400, T, "tools[0]",
     "minimum: must be a number"),
    ("schema-minlength-negative", {"tools": [tool(params(minLength=-1))]}, 400, T, "tools[0]",
     "minLength: must be a non-negative integer"),
    ("schema-maxitems-float", {"tools": [tool(params(maxItems=1.5))]}, 400, T, "tools[0]",
     "maxItems: must be a non-negative integer"),
    ("schema-properties-list", {"tools": [tool({"type": "object", "properties": [1]})]}, 400,
     T, "tools[0]", "must map names to schemas"),
    ("schema-property-number", {"tools": [tool({"type": "object", "properties": {"a": 3}})]},
     400, T, "tools[0]", "properties.a"),
    ("schema-required-string", {"tools": [tool({"type": "object", "required": "a"})]}, 400, T,
     "tools[0]", "list of property names"),
    ("schema-enum-string", {"tools": [tool(params(enum="ab"))]}, 400, T, "tools[0]",
     "enum: must be a list"),
    ("schema-anyof-empty", {"tools": [tool(params(anyOf=[]))]}, 400, T, "tools[0]",
     "non-empty list of schemas"),
    ("schema-items-number", {"tools": [tool(params(type="array", items=5))]}, 400, T,
     "tools[0]", "items"),
    ("schema-pattern-number", {"tools": [tool(params(pattern=5))]}, 400, T, "tools[0]",
     "pattern: must be a string"),
    ("schema-description-object", {"tools": [tool(params(description={"x": 1}))]}, 400, T,
     "tools[0]", "description: must be a string"),
    ("tool-choice-unknown", {"tool_choice": "sometimes"}, 400, V, "tool_choice",
     "'none', 'auto' or 'required'"),
    ("tool-choice-without-tools", {"tool_choice": "required"}, 400, V, "tool_choice",
     "needs tools"),
    ("tool-choice-unknown-tool", {"tools": [tool()], "tool_choice": {"type": "function",
     "function": {"name": "g"}}}, 400, V, "tool_choice", "unknown tool 'g'"),
    ("tool-choice-no-function", {"tools": [tool()], "tool_choice": {"type": "function"}}, 400,
     V, "tool_choice.function", "Field required"),
    # nesting: refused before any parser recurses into it
    ("deep-tool-call-arguments", {"messages": [call(name="f", arguments=nested(40))]}, 400, L,
     None, "--max-depth 32"),
    ("deep-tool-schema", {"tools": [tool(nested(40))]}, 400, L, None, "--max-depth 32"),
    ("deep-content-part", {"messages": [{"role": "user", "content": [nested(40)]}]}, 400, L,
     None, "--max-depth 32"),
    ("deep-unknown-field", {"metadata": nested(33)}, 400, L, None, "--max-depth 32"),
    # arguments as a JSON string: JSON inside JSON, which the body's depth check cannot see
    *[(f"deep-string-arguments-{n}", {"messages": [call(name="f", arguments=deep_json(n))]},
       400, L, "messages.0.tool_calls.0.function.arguments", "--max-depth 32")
      for n in (33, 900, 2500)],
    # fields that would change what the reply is: refused, not ignored
    ("reasoning-effort", {"reasoning_effort": "high"}, 400, "unsupported_value",
     "reasoning_effort", "does not reason"),
    ("response-format-unknown", {"response_format": {"type": "yaml"}}, 400, V,
     "response_format.type", "'yaml'"),
]  # fmt: skip

RAW: list[tuple[str, bytes, str, int, str, str]] = [
    # (id, body, content type, status, code, words the message must contain)
    ("not-json", b'{"model": "tiny", "mess', "application/json", 400, "invalid_json",
     "not valid JSON"),
    ("array", b"[1, 2]", "application/json", 400, V, "must be a JSON object"),
    ("null", b"null", "application/json", 400, V, "must be a JSON object"),
    ("empty", b"", "application/json", 400, V, "must be a JSON object"),
    ("not-utf8", json.dumps(GOOD).encode()[:-1] + b', "user": "\xff"}', "application/json", 400,
     "invalid_json", "can't decode byte 0xff"),
    ("form", json.dumps(GOOD).encode(), "application/x-www-form-urlencoded", 400, V,
     "Content-Type: application/json"),
    ("nan-temperature", json.dumps(GOOD).encode()[:-1] + b', "temperature": NaN}',
     "application/json", 400, "invalid_json", "NaN is not a finite number"),
    # numbers Python's parser reads and JSON has not, or that overflow a double: echoed back
    # (a Responses tool) or compared, they were a 500
    ("infinity-in-metadata", json.dumps(GOOD).encode()[:-1] + b', "metadata": {"a": -Infinity}}',
     "application/json", 400, "invalid_json", "-Infinity is not a finite number"),
    ("overflowing-exponent", json.dumps(GOOD).encode()[:-1] + b', "top_p": 1E400}',
     "application/json", 400, "invalid_json", "1E400 is not a finite number"),
    ("long-integer", json.dumps(GOOD).encode()[:-1] + b', "seed": ' + b"9" * 5000 + b"}",
     "application/json", 400, "invalid_json", "value has 5000 digits"),
    ("deep-array-text", b"[" * 5000 + b"]" * 5000, "application/json", 400, L, "--max-depth 32"),
    ("deep-raw-arguments", ('{"model": "tiny", "messages": [{"role": "assistant", "tool_calls": '
     '[{"function": {"name": "f", "arguments": ' + deep_json(5000) + "}}]}]}").encode(),
     "application/json", 400, L, "--max-depth 32"),
    ("body-too-big", json.dumps({**GOOD, "user": "x" * 70_000}).encode(), "application/json",
     413, L, "--max-body-bytes 65536"),
]  # fmt: skip


def check_error(r: Any, status: int, code: str, needle: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    err = dict(body["error"])
    assert err["code"] == code
    assert needle in err["message"], err["message"]
    return err


@pytest.mark.parametrize(("fields", "status", "code", "param", "needle"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_field_is_named(
    client: TestClient, fields: dict[str, Any], status: int, code: str, param: str | None,
    needle: str,
) -> None:  # fmt: skip
    body = {k: v for k, v in {**GOOD, **fields}.items() if v is not None or k != "model"}
    if "messages" in fields and fields["messages"] is None:
        body["messages"] = None
    content = json.dumps(body)  # \ud800 escaped, as a client's JSON encoder would send it
    r = client.post(URL, content=content, headers={"content-type": "application/json"})
    err = check_error(r, status, code, needle)
    assert err["param"] == param


@pytest.mark.parametrize(("content", "content_type", "status", "code", "needle"),
                         [c[1:] for c in RAW], ids=[c[0] for c in RAW])  # fmt: skip
def test_a_bad_body_is_named(
    client: TestClient, content: bytes, content_type: str, status: int, code: str, needle: str
) -> None:
    r = client.post(URL, content=content, headers={"content-type": content_type})
    err = check_error(r, status, code, needle)
    assert "sys." not in err["message"]  # Python's advice to its own code is not the client's


@pytest.mark.parametrize(
    ("text", "found"),
    [(b'{"a": NaN}', "NaN"), (b'[1, -Infinity]', "-Infinity"), (b'{"a": 1E400}', "1E400"),
     (b'{"a": -2.5e+309}', "-2.5e+309"), (b'{"a": 1.5e308, "b": 1e-999, "c": -0.0}', None),
     (b'{"NaN": "Infinity 1E400", "x": "\\" NaN"}', None)],
    ids=["nan", "minus-infinity", "overflow", "signed-overflow", "finite", "in-strings"],
)  # fmt: skip
def test_nonfinite_numbers_are_found_outside_strings_only(text: bytes, found: str | None) -> None:
    assert nonfinite_number(text) == found
    # BodyLimit blanks a body's strings once for both scans: the same answer
    assert nonfinite_number(blank_strings(text), blanked=True) == found


def test_words_like_nan_in_text_are_served(client: TestClient) -> None:
    body = {**GOOD, "user": "NaN Infinity 1E400"}
    assert client.post(URL, json=body).status_code == 200


def test_string_arguments_within_the_depth_limit_are_served(client: TestClient) -> None:
    body = {**GOOD, "messages": [call(name="f", arguments=deep_json(20)), USER]}
    assert client.post(URL, json=body).status_code == 200


def test_response_format_text_is_accepted(client: TestClient) -> None:
    assert client.post(URL, json={**GOOD, "response_format": {"type": "text"}}).status_code == 200


def test_an_unknown_path_lists_the_endpoints(client: TestClient) -> None:
    r = client.post("/v1/completion", json=GOOD)
    err = check_error(r, 404, "not_found", "/v1/chat/completions")
    assert "/v1/responses" in err["message"] and "/v1/completion" in err["message"]


def test_the_suite_is_broad_and_the_server_still_serves(client: TestClient) -> None:
    assert len({c[0] for c in CASES} | {c[0] for c in RAW}) >= 80
    assert client.post(URL, json=GOOD).status_code == 200
    metrics = client.get("/metrics").text
    assert 'status="5' not in metrics  # no 5xx in the whole suite


def test_a_tiny_temperature_decodes_greedily(client: TestClient) -> None:
    greedy = client.post(URL, json={**GOOD, "max_tokens": 6, "temperature": 0}).json()
    tiny_t = client.post(URL, json={**GOOD, "max_tokens": 6, "temperature": 1e-320})
    assert tiny_t.status_code == 200
    assert tiny_t.json()["choices"] == greedy["choices"]


def test_a_long_bad_role_is_not_echoed_whole(client: TestClient) -> None:
    body = {**GOOD, "messages": [{"role": "w" * 10_000, "content": "x"}]}
    err = check_error(client.post(URL, json=body), 400, V, "unknown message role")
    assert len(err["message"]) < 400


def test_a_surrogate_pair_is_text_and_an_escaped_backslash_is_no_escape(
    client: TestClient,
) -> None:
    """The lone-surrogate check reads JSON escapes: an emoji sent as its pair of escapes is
    text, and so is the six characters `\\ud800` sent with the backslash escaped."""
    from agentcache.server.limits import lone_surrogate, surrogate_path

    text = "\U0001f600 and \\ud800 written out"
    content = json.dumps({**GOOD, "messages": [{"role": "user", "content": text}]})
    assert "\\ud83d\\ude00" in content and not lone_surrogate(content.encode())
    r = client.post(URL, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    for raw, path in ((rb'{"a": ["x", {"b": "\ud83dx"}]}', "a.1.b"), (rb'"\udc00"', ""),
                      (rb'{"a": "\ud800\ud83d\ude00"}', "a"), (rb'{"a": "\ud83d\\ude00"}', "a"),
                      (rb'{"a": "\\\ud800"}', "a"), (rb'{"a": "\ud800\ud800"}', "a")):  # fmt: skip
        assert lone_surrogate(raw) and surrogate_path(raw) == path, raw
    assert not lone_surrogate(rb'{"a": "\\ud800", "b": "\ud800\udc00", "c": "\\\\udc00"}')
    raw = json.dumps({**GOOD, "user": "\ud800"}, ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
    assert lone_surrogate(raw) and surrogate_path(raw) == "user"
    r = client.post(URL, content=raw, headers={"content-type": "application/json"})
    assert check_error(r, 400, "invalid_value", "not valid Unicode")["param"] == "user"


def test_the_depth_scan_skips_strings_as_the_plain_pattern_does() -> None:
    """json_depth blanks strings with an unrolled pattern (plain runs in one step); on random
    texts of quotes, backslashes, brackets and letters it blanks what the one-byte-at-a-time
    pattern blanks, and brackets inside strings never count."""
    import random
    import re

    from agentcache.server.limits import _STRING, json_depth

    plain = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
    rng = random.Random(7)
    for _ in range(5000):
        s = bytes(rng.choice(b'ab"\\{}[]\n') for _ in range(rng.randint(0, 30)))
        assert _STRING.sub(b'""', s) == plain.sub(b'""', s), s
    deep = b'{"a": "[[[{{{\\"]]]", "b": [1]}'
    assert json_depth(deep, 10) == 2
    assert json_depth(blank_strings(deep), 10, blanked=True) == 2
