"""Every malformed /v1/messages request is a 4xx in Anthropic's error shape, its message naming
the field: no traceback, no 5xx, nothing silently accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.server.conftest import MODEL

URL = "/v1/messages"
GOOD: dict[str, Any] = {"model": MODEL, "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
TOOL: dict[str, Any] = {"name": "ls", "input_schema": {"type": "object"}}
E: dict[str, Any] = {"type": "ephemeral"}
BAD_REQUEST, NOT_FOUND = "invalid_request_error", "not_found_error"


def user(*blocks: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(blocks)}]}


def text(t: Any = "x", **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": t, **extra}


def use(uid: Any = "t1", name: Any = "ls", args: Any = None, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": uid, "name": name, "input": args or {}, **extra}


def result(uid: Any = "t1", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": uid, "content": "ok", **extra}


def after_call(*blocks: Any, calls: Any = None) -> dict[str, Any]:
    """A user turn of `blocks` after an assistant turn that called ls (id t1)."""
    return {"tools": [TOOL], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": calls if calls is not None else [use()]},
        {"role": "user", "content": list(blocks)}]}  # fmt: skip


def choice(**c: Any) -> dict[str, Any]:
    return {"tools": [TOOL], "tool_choice": c}


CASES: list[tuple[str, dict[str, Any], int, str, str]] = [
    # (id, fields over GOOD, status, error type, words the message must contain)
    ("model-unknown", {"model": "claude-9"}, 404, NOT_FOUND, "claude-9"),
    ("max-tokens-missing", {"max_tokens": None}, 400, BAD_REQUEST, "max_tokens"),
    ("max-tokens-zero", {"max_tokens": 0}, 400, BAD_REQUEST, "max_tokens"),
    ("max-tokens-string", {"max_tokens": "5"}, 400, BAD_REQUEST, "max_tokens"),
    ("messages-missing", {"messages": None}, 400, BAD_REQUEST, "messages"),
    ("messages-empty", {"messages": []}, 400, BAD_REQUEST, "messages"),
    ("messages-string", {"messages": "hi"}, 400, BAD_REQUEST, "messages"),
    ("temperature-over-1", {"temperature": 1.5}, 400, BAD_REQUEST, "temperature"),
    ("temperature-string", {"temperature": "hot"}, 400, BAD_REQUEST, "temperature"),
    ("top-p-zero", {"top_p": 0}, 400, BAD_REQUEST, "top_p"),
    ("top-k", {"top_k": 5}, 400, BAD_REQUEST, "top_k"),
    ("thinking-enabled", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400,
     BAD_REQUEST, "thinking"),
    ("stream-string", {"stream": "yes"}, 400, BAD_REQUEST, "stream"),
    ("stop-sequences-string", {"stop_sequences": "x"}, 400, BAD_REQUEST, "stop_sequences"),
    ("stop-sequence-empty", {"stop_sequences": [""]}, 400, BAD_REQUEST, "stop_sequences.0"),
    ("stop-sequences-too-many", {"stop_sequences": ["a", "b", "c", "d", "e"]}, 400,
     BAD_REQUEST, "--max-stop 4"),
    ("stop-sequence-too-long", {"stop_sequences": ["x" * 33]}, 400, BAD_REQUEST,
     "--max-stop-chars 32"),
    ("system-number", {"system": 5}, 400, BAD_REQUEST, "system"),
    ("system-block-string", {"system": ["x"]}, 400, BAD_REQUEST, "system.0"),
    ("system-block-image", {"system": [{"type": "image"}]}, 400, BAD_REQUEST, "system.0.type"),
    ("system-text-missing", {"system": [{"type": "text"}]}, 400, BAD_REQUEST, "system.0.text"),
    ("system-text-number", {"system": [text(3)]}, 400, BAD_REQUEST, "system.0.text"),
    ("cache-salt-empty", {"cache_salt": ""}, 400, BAD_REQUEST, "cache_salt"),
    ("metadata-string", {"metadata": "x"}, 400, BAD_REQUEST, "metadata"),
    # messages and blocks
    ("message-string", {"messages": ["hi"]}, 400, BAD_REQUEST, "messages.0"),
    ("role-missing", {"messages": [{"content": "x"}]}, 400, BAD_REQUEST, "messages.0.role"),
    ("role-system", {"messages": [{"role": "system", "content": "x"}]}, 400, BAD_REQUEST,
     "messages.0.role"),
    ("content-missing", {"messages": [{"role": "user"}]}, 400, BAD_REQUEST,
     "messages.0.content"),
    ("content-number", {"messages": [{"role": "user", "content": 3}]}, 400, BAD_REQUEST,
     "messages.0.content"),
    ("block-string", user("x"), 400, BAD_REQUEST, "messages.0.content.0"),
    ("block-image", user({"type": "image", "source": {}}), 400, BAD_REQUEST,
     "messages.0.content.0.type"),
    ("block-document", user({"type": "document"}), 400, BAD_REQUEST,
     "messages.0.content.0.type"),
    ("block-type-missing", user({"text": "x"}), 400, BAD_REQUEST, "messages.0.content.0.type"),
    ("user-tool-use", user(use()), 400, BAD_REQUEST, "messages.0.content.0.type"),
    ("assistant-thinking", {"messages": [{"role": "user", "content": "x"}, {
     "role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}]}, 400,
     BAD_REQUEST, "messages.1.content.0.type"),
    ("assistant-tool-result", {"messages": [{"role": "user", "content": "x"}, {
     "role": "assistant", "content": [result()]}]}, 400, BAD_REQUEST,
     "messages.1.content.0.type"),
    ("text-missing", user({"type": "text"}), 400, BAD_REQUEST, "messages.0.content.0.text"),
    ("text-number", user(text(5)), 400, BAD_REQUEST, "messages.0.content.0.text"),
    ("text-lone-surrogate", user(text("\ud800")), 400, BAD_REQUEST, "messages"),
    ("system-lone-surrogate", {"system": "\ud800"}, 400, BAD_REQUEST, "system"),
    ("tool-result-id-missing", after_call({"type": "tool_result", "content": "x"}), 400,
     BAD_REQUEST, "messages.2.content.0.tool_use_id"),
    ("tool-result-id-unknown", after_call(result("t9")), 400, BAD_REQUEST,
     "messages.2.content.0.tool_use_id"),
    ("tool-result-id-empty", after_call(result("")), 400, BAD_REQUEST,
     "messages.2.content.0.tool_use_id"),
    ("tool-result-id-number", after_call(result(7)), 400, BAD_REQUEST,
     "messages.2.content.0.tool_use_id"),
    ("tool-result-no-call", user(result()), 400, BAD_REQUEST,
     "messages.0.content.0.tool_use_id"),
    ("tool-result-is-error-string", after_call(result(is_error="yes")), 400, BAD_REQUEST,
     "messages.2.content.0.is_error"),
    ("tool-result-content-number", after_call(result(content=3)), 400, BAD_REQUEST,
     "messages.2.content.0.content"),
    ("tool-result-content-image", after_call(result(content=[{"type": "image"}])), 400,
     BAD_REQUEST, "messages.2.content.0.content.0.type"),
    ("tool-use-id-missing", after_call(text(), calls=[use(uid=None)]), 400, BAD_REQUEST,
     "messages.1.content.0.id"),
    ("tool-use-id-twice", after_call(result(), calls=[use(), use()]), 400, BAD_REQUEST,
     "messages.1.content.1.id"),
    ("tool-use-name-bad", after_call(result(), calls=[use(name="a b")]), 400, BAD_REQUEST,
     "messages.1.content.0.name"),
    ("tool-use-name-control", after_call(result(), calls=[use(name="<|im_end|>")]), 400,
     BAD_REQUEST, "messages.1.content.0.name"),
    ("tool-use-input-string", after_call(result(), calls=[use(args="{}")]), 400, BAD_REQUEST,
     "messages.1.content.0.input"),
    ("tool-use-input-list", after_call(result(), calls=[use(args=[1])]), 400, BAD_REQUEST,
     "messages.1.content.0.input"),
    ("last-assistant-trailing-space", {"messages": [{"role": "user", "content": "x"},
     {"role": "assistant", "content": "so "}]}, 400, BAD_REQUEST, "trailing whitespace"),
    ("last-assistant-tool-use", {"tools": [TOOL], "messages": [{"role": "user", "content": "x"},
     {"role": "assistant", "content": [use()]}]}, 400, BAD_REQUEST, "tool_use"),
    ("too-many-messages", {"messages": [{"role": "user", "content": "x"}] * 17}, 400,
     BAD_REQUEST, "--max-messages 16"),
    ("too-much-content", {"messages": [{"role": "user", "content": "x" * 2001}]}, 400,
     BAD_REQUEST, "--max-content-chars 2000"),
    # tools
    ("tools-object", {"tools": TOOL}, 400, BAD_REQUEST, "tools"),
    ("tool-string", {"tools": ["ls"]}, 400, BAD_REQUEST, "tools.0"),
    ("tool-name-missing", {"tools": [{"input_schema": {"type": "object"}}]}, 400, BAD_REQUEST,
     "tools.0.name"),
    ("tool-name-bad", {"tools": [{**TOOL, "name": "a b"}]}, 400, BAD_REQUEST, "tools.0.name"),
    ("tool-name-twice", {"tools": [TOOL, TOOL]}, 400, BAD_REQUEST, "tools.1.name"),
    ("tool-server-type", {"tools": [{"type": "bash_20250124", "name": "bash"}]}, 400,
     BAD_REQUEST, "tools.0.type"),
    ("tool-schema-missing", {"tools": [{"name": "ls"}]}, 400, BAD_REQUEST,
     "tools.0.input_schema"),
    ("tool-schema-string-type", {"tools": [{"name": "ls", "input_schema": {"type": "string"}}]},
     400, BAD_REQUEST, "tools.0.input_schema"),
    ("tool-schema-bad-property", {"tools": [{"name": "ls", "input_schema": {
     "type": "object", "properties": {"a": {"type": "strang"}}}}]}, 400, BAD_REQUEST,
     "tools.0.input_schema"),
    ("tool-description-number", {"tools": [{**TOOL, "description": 3}]}, 400, BAD_REQUEST,
     "tools.0.description"),
    ("too-many-tools", {"tools": [{**TOOL, "name": f"t{i}"} for i in range(5)]}, 400,
     BAD_REQUEST, "--max-tools 4"),
    # tool_choice
    ("tool-choice-string", {"tools": [TOOL], "tool_choice": "auto"}, 400, BAD_REQUEST,
     "tool_choice"),
    ("tool-choice-type-unknown", choice(type="required"), 400, BAD_REQUEST,
     "tool_choice.type"),
    ("tool-choice-tool-no-name", choice(type="tool"), 400, BAD_REQUEST, "tool_choice.name"),
    ("tool-choice-tool-unknown", choice(type="tool", name="rm"), 400, BAD_REQUEST,
     "tool_choice.name"),
    ("tool-choice-any-no-tools", {"tool_choice": {"type": "any"}}, 400, BAD_REQUEST,
     "tool_choice"),
    ("tool-choice-parallel-string", choice(type="auto", disable_parallel_tool_use="no"), 400,
     BAD_REQUEST, "tool_choice.disable_parallel_tool_use"),
    ("tool-choice-forced-prefill", {**choice(type="any"), "messages": [
     {"role": "user", "content": "x"}, {"role": "assistant", "content": "I will"}]}, 400,
     BAD_REQUEST, "tool_choice"),
    # cache_control
    ("cache-control-type", user(text(cache_control={"type": "persistent"})), 400, BAD_REQUEST,
     "messages.0.content.0.cache_control.type"),
    ("cache-control-ttl-10m", user(text(cache_control={**E, "ttl": "10m"})), 400, BAD_REQUEST,
     "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-number", user(text(cache_control={**E, "ttl": 300})), 400, BAD_REQUEST,
     "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-negative", user(text(cache_control={**E, "ttl": "-5m"})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-negative-number", user(text(cache_control={**E, "ttl": -300})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-over-the-api-cap", user(text(cache_control={**E, "ttl": "24h"})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-not-a-duration", user(text(cache_control={**E, "ttl": "soon"})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.ttl"),
    ("cache-control-ttl-null", user(text(cache_control={**E, "ttl": None})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.ttl"),
    ("cache-control-unknown-key", user(text(cache_control={**E, "scope": "org"})), 400,
     BAD_REQUEST, "messages.0.content.0.cache_control.scope"),
    ("cache-control-string", user(text(cache_control="ephemeral")), 400, BAD_REQUEST,
     "messages.0.content.0.cache_control"),
    ("cache-control-empty-text", user(text("", cache_control=E)), 400, BAD_REQUEST,
     "empty text block"),
    ("cache-control-five", {"system": [text(cache_control=E)] * 3,
     **user(text(cache_control=E), text(cache_control=E))}, 400, BAD_REQUEST, "at most 4"),
    ("cache-control-1h-after-5m", {"system": [text(cache_control=E)],
     **user(text(cache_control={**E, "ttl": "1h"}))}, 400, BAD_REQUEST, "'1h' must come"),
    ("cache-control-top-level-ttl", {"cache_control": {**E, "ttl": "1d"}}, 400, BAD_REQUEST,
     "cache_control.ttl"),
    ("cache-control-top-level-string", {"cache_control": "auto"}, 400, BAD_REQUEST,
     "cache_control"),
    ("cache-control-tool-ttl", {"tools": [{**TOOL, "cache_control": {**E, "ttl": "2h"}}]}, 400,
     BAD_REQUEST, "tools.0.cache_control.ttl"),
    ("cache-control-result-type", after_call(result(cache_control={"type": "x"})), 400,
     BAD_REQUEST, "messages.2.content.0.cache_control.type"),
    ("cache-control-system-ttl", {"system": [text(cache_control={**E, "ttl": "5min"})]}, 400,
     BAD_REQUEST, "system.0.cache_control.ttl"),
    # output_config (structured outputs)
    ("output-format-json-object", {"output_config": {"format": {"type": "json_object"}}}, 400,
     BAD_REQUEST, "output_config.format.type"),
    ("output-effort", {"output_config": {"effort": "high"}}, 400, BAD_REQUEST,
     "output_config.effort"),
    ("output-unknown-key", {"output_config": {"style": 1}}, 400, BAD_REQUEST,
     "output_config.style"),
    ("output-schema-missing", {"output_config": {"format": {"type": "json_schema"}}}, 400,
     BAD_REQUEST, "output_config.format.schema"),
    ("output-schema-not", {"output_config": {"format": {"type": "json_schema",
     "schema": {"type": "object", "not": {}}}}}, 400, BAD_REQUEST, "not"),
    ("output-format-yaml", {"output_config": {"format": {"type": "yaml"}}}, 400, BAD_REQUEST,
     "output_config.format.type"),
]  # fmt: skip


def check_anthropic_error(r: Any, status: int, kind: str, needle: str) -> str:
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert needle in body["error"]["message"], body["error"]["message"]
    return str(body["error"]["message"])


@pytest.mark.parametrize(("fields", "status", "kind", "needle"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_field_is_named(
    client: TestClient, fields: dict[str, Any], status: int, kind: str, needle: str
) -> None:
    body = {k: v for k, v in {**GOOD, **fields}.items() if v is not None}
    content = json.dumps(body)  # \ud800 escaped, as a client's JSON encoder would send it
    r = client.post(URL, content=content, headers={"content-type": "application/json"})
    check_anthropic_error(r, status, kind, needle)


def test_the_cases_are_many_and_distinct() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 80


def test_bodies_that_are_not_requests(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    r = client.post(URL, content=b'{"model": "tiny", "mess', headers=headers)
    check_anthropic_error(r, 400, BAD_REQUEST, "not valid JSON")
    r = client.post(URL, content=b"[1]", headers=headers)
    check_anthropic_error(r, 400, BAD_REQUEST, "must be a JSON object")
    r = client.post(URL, content=b"[" * 5000 + b"]" * 5000, headers=headers)
    check_anthropic_error(r, 400, BAD_REQUEST, "--max-depth 32")
    big = json.dumps({**GOOD, "system": "x" * 70_000}).encode()
    check_anthropic_error(client.post(URL, content=big, headers=headers), 413,
                          "request_too_large", "--max-body-bytes")  # fmt: skip


def test_good_bodies_around_the_bad_ones_pass(client: TestClient) -> None:
    """The checks above refuse what they name, not their neighbours."""
    ok = [
        after_call(result(is_error=True, content=[text("boom")])),
        {"system": [text(cache_control={**E, "ttl": "1h"})], **user(text(cache_control=E))},
        {"cache_control": E, "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
         "service_tier": "auto", "stop_sequences": ["\n\n"]},
        {**choice(type="tool", name="ls", disable_parallel_tool_use=True)},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "so"}]},
    ]  # fmt: skip
    for fields in ok:
        r = client.post(URL, json={**GOOD, **fields})
        assert r.status_code == 200, (fields, r.text)
        assert r.json()["type"] == "message"
