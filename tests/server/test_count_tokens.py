"""POST /v1/messages/count_tokens through the official `anthropic` client: the count is the
prompt /v1/messages prefills for the same body (its usage's three input fields added up),
counting computes and stores nothing, and every bad body of /v1/messages is refused the same
way here."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from tests.server.conftest import MODEL
from tests.server.test_messages_bad_input import (
    BAD_REQUEST,
    CASES,
    GOOD,
    check_anthropic_error,
)

anthropic = pytest.importorskip("anthropic")

URL = "/v1/messages/count_tokens"
SYSTEM = "You are a build agent. Reply with one command."
PATH: Any = {"type": "object", "properties": {"path": {"type": "string"}}}
LS: Any = {"name": "ls", "description": "list files", "input_schema": PATH}
BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"system": SYSTEM, "tools": [LS], "messages": [{"role": "user", "content": "list"}]},
    {"system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
     "tools": [LS], "tool_choice": {"type": "any"},
     "messages": [{"role": "user", "content": "list"}]},
    {"tools": [LS], "messages": [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "."}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"},
            {"type": "text", "text": "now cat a.py"}]}]},
    {"messages": [{"role": "user", "content": "say hi"},
                  {"role": "assistant", "content": "Hi, I am"}]},  # continued: a prefill
]  # fmt: skip


def test_the_count_is_the_prompt_messages_prefills(server_url: str) -> None:
    c = anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)
    for body in BODIES:
        counted = c.messages.count_tokens(model=MODEL, **body)
        m = c.messages.create(model=MODEL, max_tokens=2, **body)
        u = m.usage
        prompt = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        assert counted.input_tokens == prompt > 0, body


def test_counting_computes_and_stores_nothing(server_url: str) -> None:
    c = anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)
    body = BODIES[1]
    for _ in range(3):
        c.messages.count_tokens(model=MODEL, **body)
    metrics = httpx.get(f"{server_url}/metrics").text
    assert "agentcache_prompt_tokens_total 0.0" in metrics
    m = c.messages.create(model=MODEL, max_tokens=2, **body)
    assert m.usage.cache_read_input_tokens == 0  # nothing was stored by counting
    assert 'endpoint="/v1/messages/count_tokens",status="200"} 3.0' in httpx.get(
        f"{server_url}/metrics").text  # fmt: skip


COUNT_CASES = [c for c in CASES if c[0] != "max-tokens-missing"]  # no max_tokens to give


@pytest.mark.parametrize(("fields", "status", "kind", "needle"), [c[1:] for c in COUNT_CASES],
                         ids=[c[0] for c in COUNT_CASES])  # fmt: skip
def test_a_bad_field_is_named(
    client: TestClient, fields: dict[str, Any], status: int, kind: str, needle: str
) -> None:
    body = {k: v for k, v in {**GOOD, **fields}.items() if v is not None}
    r = client.post(URL, content=json.dumps(body), headers={"content-type": "application/json"})
    check_anthropic_error(r, status, kind, needle)


def test_bounded_like_messages(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    check_anthropic_error(client.post(URL, content=b"[" * 5000 + b"]" * 5000, headers=headers),
                          400, BAD_REQUEST, "--max-depth 32")  # fmt: skip
    big = json.dumps({**GOOD, "system": "x" * 70_000}).encode()
    check_anthropic_error(client.post(URL, content=big, headers=headers), 413,
                          "request_too_large", "--max-body-bytes")  # fmt: skip
    r = client.post(URL, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and set(r.json()) == {"input_tokens"}


def test_an_unknown_path_lists_what_is_served(client: TestClient) -> None:
    for path in ("/v1/completions", "/v1/messages/batches", "/v2/chat"):
        r = client.post(path, json={})
        assert r.status_code == 404
        text = r.text
        for served in ("/v1/chat/completions", "/v1/responses", "/v1/messages", URL):
            assert served in text, (path, text)
