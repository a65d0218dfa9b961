"""Every malformed /v1/responses request is a 400 (404 for ids not found) in the API's error
shape naming the field: no traceback, no 5xx, nothing silently accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.server.conftest import MODEL
from tests.server.test_bad_input import check_error, deep_json

URL = "/v1/responses"
GOOD: dict[str, Any] = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
FN: dict[str, Any] = {"type": "function", "name": "f", "parameters": {"type": "object"}}
V, T, L, U = "invalid_value", "invalid_tool_schema", "limit_exceeded", "unsupported_value"


def item(**fields: Any) -> dict[str, Any]:
    return {"input": [fields]}


def fcall(**fields: Any) -> dict[str, Any]:
    return item(**{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}",
                   **fields})  # fmt: skip


CASES: list[tuple[str, dict[str, Any], int, str, str | None, str]] = [
    ("model-unknown", {"model": "gpt-9"}, 404, "model_not_found", "model", "gpt-9"),
    ("input-missing", {"input": None}, 400, V, "input", "input"),
    ("input-number", {"input": 5}, 400, V, "input", "input"),
    ("input-empty", {"input": []}, 400, V, "input", "at least one item"),
    ("input-item-string", {"input": ["hi"]}, 400, V, "input.0", "valid dictionary"),
    ("item-type-unknown", item(type="reasoning"), 400, V, "input.0.type", "'reasoning'"),
    ("message-role-unknown", item(role="wizard", content="x"), 400, V, "input.0.role",
     "'wizard'"),
    ("message-role-missing", item(content="x"), 400, V, "input.0.role", "unknown role"),
    ("message-content-number", item(role="user", content=5), 400, V, "input.0.content",
     "got int"),
    ("message-content-missing", item(role="user"), 400, V, "input.0.content", "got NoneType"),
    ("part-string", item(role="user", content=["x"]), 400, V, "input.0.content.0",
     "part object"),
    ("part-image", item(role="user", content=[{"type": "input_image", "image_url": "x"}]), 400,
     V, "input.0.content.0.type", "only text parts"),
    ("part-file", item(role="user", content=[{"type": "input_file"}]), 400, V,
     "input.0.content.0.type", "'input_file'"),
    ("part-text-number", item(role="user", content=[{"type": "input_text", "text": 3}]), 400,
     V, "input.0.content.0.text", "string is required"),
    ("message-lone-surrogate", item(role="user", content="\ud800"), 400, V, "input.0.content",
     "not valid Unicode"),
    ("input-lone-surrogate", {"input": "x\udbff"}, 400, V, "input", "not valid Unicode"),
    ("call-arguments-lone-surrogate", fcall(arguments="\ud800"), 400, V, "input.0.arguments",
     "not valid Unicode"),
    ("instructions-lone-surrogate", {"instructions": "\ud800"}, 400, V, "instructions",
     "not valid Unicode"),
    ("message-role-list", item(role=[None], content="x"), 400, V, "input.0.role",
     "unknown role"),
    ("part-type-object", item(role="user", content=[{"type": {}, "text": "x"}]), 400, V,
     "input.0.content.0.type", "only text parts"),
    ("call-no-call-id", fcall(call_id=None), 400, V, "input.0.call_id", "string is required"),
    ("call-empty-name", fcall(name=""), 400, V, "input.0.name", "non-empty string"),
    ("call-arguments-object", fcall(arguments={"a": 1}), 400, V, "input.0.arguments",
     "got dict"),
    ("call-arguments-not-json", fcall(arguments="{"), 400, V, "input.0.arguments",
     "not valid JSON"),
    ("call-arguments-long-integer", fcall(arguments='{"x": ' + "9" * 5000 + "}"), 400, V,
     "input.0.arguments", "not valid JSON: Exceeds the limit (4300 digits)"),
    ("call-arguments-array", fcall(arguments="[1]"), 400, V, "input.0.arguments",
     "JSON object"),
    ("call-arguments-deep", fcall(arguments=deep_json(2500)), 400, L, "input.0.arguments",
     "--max-depth 32"),
    ("output-no-call-id", item(type="function_call_output", output="x"), 400, V,
     "input.0.call_id", "string is required"),
    ("output-number", item(type="function_call_output", call_id="c", output=5), 400, V,
     "input.0.output", "got int"),
    ("instructions-number", {"instructions": 5}, 400, V, "instructions", "valid string"),
    ("tools-object", {"tools": {"type": "function"}}, 400, V, "tools", "valid list"),
    ("tool-web-search", {"tools": [{"type": "web_search"}]}, 400, V, "tools.0.type",
     "only function tools"),
    ("tool-chat-shape", {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, T,
     "tools.0", "function name"),
    ("tool-bad-schema", {"tools": [{**FN, "parameters": {"type": "wizard"}}]}, 400, T,
     "tools.0", "wizard"),
    ("tool-name-number", {"tools": [{**FN, "name": 5}]}, 400, T, "tools.0",
     "function name must be a string, got 5"),
    ("tool-name-null", {"tools": [{**FN, "name": None}]}, 400, T, "tools.0",
     "function name must be a string, got None"),
    ("tool-description-list", {"tools": [{**FN, "description": ["d"]}]}, 400, T, "tools.0",
     "description must be a string, got ['d']"),
    ("tools-too-many", {"tools": [FN] * 5}, 400, L, "tools", "--max-tools 4"),
    ("tool-choice-unknown", {"tools": [FN], "tool_choice": "sometimes"}, 400, V, "tool_choice",
     "tool_choice"),
    ("tool-choice-without-tools", {"tool_choice": "required"}, 400, V, "tool_choice",
     "needs tools"),
    ("tool-choice-unknown-tool", {"tools": [FN], "tool_choice": {"type": "function",
     "name": "g"}}, 400, V, "tool_choice", "unknown tool 'g'"),
    ("tool-choice-chat-shape", {"tools": [FN], "tool_choice": {"type": "function",
     "function": {"name": "f"}}}, 400, V, "tool_choice.name", "Field required"),
    ("max-output-tokens-zero", {"max_output_tokens": 0}, 400, V, "max_output_tokens",
     "greater than or equal to 1"),
    ("max-output-tokens-string", {"max_output_tokens": "5"}, 400, V, "max_output_tokens",
     "valid integer"),
    ("temperature-high", {"temperature": 3}, 400, V, "temperature", "less than or equal"),
    ("top-p-zero", {"top_p": 0}, 400, V, "top_p", "greater than 0"),
    ("stream-string", {"stream": "yes"}, 400, V, "stream", "valid boolean"),
    ("store-string", {"store": "no"}, 400, V, "store", "valid boolean"),
    ("previous-unknown", {"previous_response_id": "resp_nope"}, 404, "not_found",
     "previous_response_id", "resp_nope"),
    ("previous-empty", {"previous_response_id": ""}, 400, V, "previous_response_id",
     "at least 1"),
    ("text-format-unknown", {"text": {"format": {"type": "yaml"}}}, 400, V, "text.format.type",
     "'yaml'"),
    ("reasoning", {"reasoning": {"effort": "low"}}, 400, U, "reasoning", "does not reason"),
    ("user-too-long", {"user": "u" * 65}, 400, L, "user", "--max-user-chars 64"),
    ("metadata-number-value", {"metadata": {"k": 1}}, 400, V, "metadata", "valid string"),
    ("too-many-items", {"input": [{"role": "user", "content": "x"}] * 17}, 400, L, "input",
     "--max-messages 16"),
    ("too-much-content", {"input": "x" * 2001}, 400, L, "input", "--max-content-chars 2000"),
    ("context-too-long", {"max_output_tokens": 100_000}, 400, "context_length_exceeded",
     "max_output_tokens", "KV pool"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "status", "code", "param", "needle"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_field_is_named(
    client: TestClient, fields: dict[str, Any], status: int, code: str, param: str | None,
    needle: str,
) -> None:  # fmt: skip
    body = {k: v for k, v in {**GOOD, **fields}.items() if v is not None}
    for key in ("call_id", "name"):  # a None inside an item: the key left out
        for it in body.get("input", []) if isinstance(body.get("input"), list) else []:
            if isinstance(it, dict) and it.get(key, 0) is None:
                del it[key]
    r = client.post(URL, content=json.dumps(body), headers={"content-type": "application/json"})
    err = check_error(r, status, code, needle)
    assert err["param"] == param


def test_the_server_still_serves_and_no_5xx(client: TestClient) -> None:
    assert len(CASES) >= 45
    r = client.post(URL, json={**GOOD, "text": {"format": {"type": "text"}},
                               "metadata": {"k": "v"}})  # fmt: skip
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "v"}
    r = client.post(URL, content=b"[1]", headers={"content-type": "application/json"})
    assert "'input'" in check_error(r, 400, V, "must be a JSON object")["message"]
    assert 'status="5' not in client.get("/metrics").text
