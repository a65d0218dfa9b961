"""Structured outputs: every reply held to its schema parses and validates (on a random tiny
model, so the grammar, not the model, makes it valid), on chat completions, Responses and
Messages; a strict forced call's arguments fit the tool's schema; what llguidance cannot
enforce is a 400 naming the construct."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.bench.server.schemas import SCHEMAS, validate
from agentcache.model.loading import LoadedModel
from tests.server.conftest import MODEL, tiny_app

pytest.importorskip("llguidance")

MAX = 400  # bytes (the tiny model's tokens); every schema's longest reply fits


@pytest.fixture(scope="module")
def client(tiny: LoadedModel) -> Iterator[TestClient]:
    with TestClient(tiny_app(tiny, kv_pages=256)) as c:
        yield c


def chat(client: TestClient, fmt: Any, **extra: Any) -> Any:
    body = {"model": MODEL, "max_tokens": MAX, "temperature": 0, "response_format": fmt,
            "messages": [{"role": "user", "content": "reply in JSON"}], **extra}  # fmt: skip
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


FAST = ("agent-step", "anyof-object", "array-objects", "defs-ref")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in sorted(SCHEMAS)]
)
def test_every_reply_parses_and_validates(client: TestClient, name: str) -> None:
    schema = SCHEMAS[name]
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                      "strict": True}}  # fmt: skip
        choice = chat(client, fmt, **sampling)
        assert choice["finish_reason"] == "stop", choice
        reply = json.loads(choice["message"]["content"])
        assert validate(reply, schema) is None, (reply, validate(reply, schema))


def test_there_are_at_least_30_schemas() -> None:
    assert len(SCHEMAS) >= 30


def test_json_object_replies_are_objects(client: TestClient) -> None:
    choice = chat(client, {"type": "json_object"}, temperature=1.0, seed=3)
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_unconstrained_replies_are_not_json(client: TestClient) -> None:
    """The check above can fail: without the grammar the random model writes no JSON."""
    choice = chat(client, {"type": "text"})
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])


def test_responses_text_format_and_messages_output_config(client: TestClient) -> None:
    schema = SCHEMAS["agent-step"]
    r = client.post("/v1/responses", json={
        "model": MODEL, "input": "next step", "max_output_tokens": MAX, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "step", "schema": schema}}})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert validate(json.loads(body["output"][0]["content"][0]["text"]), schema) is None
    assert body["text"]["format"]["type"] == "json_schema"
    m = client.post("/v1/messages", json={
        "model": MODEL, "max_tokens": MAX, "temperature": 0,
        "messages": [{"role": "user", "content": "next step"}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})  # fmt: skip
    assert m.status_code == 200, m.text
    assert validate(json.loads(m.json()["content"][0]["text"]), schema) is None


def test_a_strict_forced_calls_arguments_fit_the_tools_schema(client: TestClient) -> None:
    params = SCHEMAS["tool-args"]
    tool = {"type": "function", "function": {"name": "ls", "parameters": params, "strict": True}}
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": MAX, "temperature": 1.0, "seed": 5, "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "ls"}},
        "messages": [{"role": "user", "content": "list"}]})  # fmt: skip
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    args = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    assert validate(args, params) is None


@pytest.mark.parametrize(
    ("schema", "construct"),
    [({"type": "object", "not": {"required": ["a"]}}, "not"),
     ({"type": "string", "format": "no-such-format"}, "no-such-format")],
)  # fmt: skip
def test_a_schema_llguidance_cannot_enforce_is_a_400(
    client: TestClient, schema: Any, construct: str
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 4, "response_format": fmt,
        "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema"
    assert err["code"] == "unsupported_schema" and construct in err["message"]
