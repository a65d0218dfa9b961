"""The request surface beyond messages on chat completions and Responses: structured-output
formats, logprobs, parallel_tool_calls, allowed_tools, cache retention and the fields accepted
without effect; each malformed one a 400 naming it."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.runtime import loop as loop_module
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL
from tests.server.test_bad_input import check_error

CHAT, RESP = "/v1/chat/completions", "/v1/responses"
GOOD: dict[str, Any] = {"model": MODEL, "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
RGOOD: dict[str, Any] = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
V, S, U = "invalid_value", "invalid_schema", "unsupported_schema"
OBJ: dict[str, Any] = {"type": "object"}
NOT: dict[str, Any] = {"type": "object", "not": {"required": ["a"]}}


def rf(**json_schema: Any) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": json_schema}}


def fn(name: str = "ls", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": OBJ, **extra}}


def tf(**fmt: Any) -> dict[str, Any]:
    return {"text": {"format": {"type": "json_schema", **fmt}}}


CASES: list[tuple[str, str, dict[str, Any], str, str, str]] = [
    # (id, url, fields, code, param, words the message must contain)
    ("rf-string", CHAT, {"response_format": "json"}, V, "response_format", "dictionary"),
    ("rf-type-missing", CHAT, {"response_format": {"json_schema": {}}}, V,
     "response_format.type", "unknown type"),
    ("rf-json-schema-missing", CHAT, {"response_format": {"type": "json_schema"}}, V,
     "response_format.json_schema", "object with the schema"),
    ("rf-name-missing", CHAT, rf(schema=OBJ), V, "response_format.json_schema.name", "name"),
    ("rf-name-bad", CHAT, rf(name="a b", schema=OBJ), V, "response_format.json_schema.name",
     "letters"),
    ("rf-schema-missing", CHAT, rf(name="x"), V, "response_format.json_schema.schema",
     "JSON Schema object"),
    ("rf-schema-string", CHAT, rf(name="x", schema="{}"), V,
     "response_format.json_schema.schema", "got str"),
    ("rf-schema-bad-type", CHAT, rf(name="x", schema={"type": "strang"}), S,
     "response_format.json_schema.schema", "'strang'"),
    ("rf-schema-bad-required", CHAT, rf(name="x", schema={"type": "object", "required": "a"}),
     S, "response_format.json_schema.schema", "required"),
    ("rf-strict-string", CHAT, rf(name="x", schema=OBJ, strict="yes"), V,
     "response_format.json_schema.strict", "boolean"),
    ("rf-schema-not", CHAT, rf(name="x", schema=NOT), U, "response_format.json_schema.schema",
     "not"),
    ("rf-schema-format", CHAT, rf(name="x", schema={"type": "string", "format": "nope"}), U,
     "response_format.json_schema.schema", "nope"),
    ("parallel-string", CHAT, {"parallel_tool_calls": "no", "tools": [fn()]}, V,
     "parallel_tool_calls", "boolean"),
    ("tool-strict-string", CHAT, {"tools": [fn(strict="yes")]}, V, "tools.0.function.strict",
     "boolean"),
    ("strict-forced-not", CHAT, {"tools": [{"type": "function", "function": {
     "name": "ls", "parameters": NOT, "strict": True}}], "tool_choice": "required"}, U,
     "tools.0.parameters", "not"),
    ("logprobs-string", CHAT, {"logprobs": "yes"}, V, "logprobs", "boolean"),
    ("top-logprobs-21", CHAT, {"logprobs": True, "top_logprobs": 21}, V, "top_logprobs",
     "20"),
    ("top-logprobs-alone", CHAT, {"top_logprobs": 2}, V, "top_logprobs", "logprobs"),
    ("allowed-unknown-tool", CHAT, {"tools": [fn()], "tool_choice": {
     "type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
      {"type": "function", "function": {"name": "rm"}}]}}}, V,
     "tool_choice.allowed_tools.tools.0", "'rm'"),
    ("allowed-mode-bad", CHAT, {"tools": [fn()], "tool_choice": {
     "type": "allowed_tools", "allowed_tools": {"mode": "always", "tools": [
      {"type": "function", "function": {"name": "ls"}}]}}}, V,
     "tool_choice.allowed_tools.mode", "auto"),
    ("allowed-empty", CHAT, {"tools": [fn()], "tool_choice": {
     "type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}}, V,
     "tool_choice.allowed_tools.tools", "at least 1"),
    ("retention-forever", CHAT, {"prompt_cache_retention": "forever"}, V,
     "prompt_cache_retention", "'in_memory' or '24h'"),
    ("retention-number", CHAT, {"prompt_cache_retention": 24}, V, "prompt_cache_retention",
     "'24h'"),
    ("cache-options-string", CHAT, {"prompt_cache_options": "1h"}, V, "prompt_cache_options",
     "object"),
    ("cache-options-ttl-2d", CHAT, {"prompt_cache_options": {"ttl": "2d"}}, V,
     "prompt_cache_options.ttl", "'2d'"),
    ("cache-options-ttl-zero", CHAT, {"prompt_cache_options": {"ttl": 0}}, V,
     "prompt_cache_options.ttl", "[1, 86400]"),
    ("cache-options-ttl-bool", CHAT, {"prompt_cache_options": {"ttl": True}}, V,
     "prompt_cache_options.ttl", "True"),
    ("cache-options-ttl-negative", CHAT, {"prompt_cache_options": {"ttl": -300}}, V,
     "prompt_cache_options.ttl", "-300"),
    ("cache-options-ttl-over-the-api-cap", CHAT, {"prompt_cache_options": {"ttl": 86401}}, V,
     "prompt_cache_options.ttl", "[1, 86400]"),
    ("cache-options-ttl-huge", CHAT, {"prompt_cache_options": {"ttl": 10**30}}, V,
     "prompt_cache_options.ttl", "[1, 86400]"),
    ("cache-options-ttl-fraction", CHAT, {"prompt_cache_options": {"ttl": 300.5}}, V,
     "prompt_cache_options.ttl", "whole seconds"),
    ("cache-options-ttl-digits", CHAT, {"prompt_cache_options": {"ttl": "600"}}, V,
     "prompt_cache_options.ttl", "'600'"),
    ("cache-options-ttl-negative-duration", CHAT, {"prompt_cache_options": {"ttl": "-5m"}}, V,
     "prompt_cache_options.ttl", "'-5m'"),
    ("cache-options-ttl-null", CHAT, {"prompt_cache_options": {"ttl": None}}, V,
     "prompt_cache_options.ttl", "None"),
    ("retention-negative", CHAT, {"prompt_cache_retention": "-24h"}, V,
     "prompt_cache_retention", "'-24h'"),
    ("retention-48h", CHAT, {"prompt_cache_retention": "48h"}, V, "prompt_cache_retention",
     "'48h'"),
    ("cache-options-unknown", CHAT, {"prompt_cache_options": {"scope": "org"}}, V,
     "prompt_cache_options.scope", "unknown field"),
    ("metadata-number", CHAT, {"metadata": {"k": 1}}, V, "metadata", "string"),
    ("store-string", CHAT, {"store": "yes"}, V, "store", "boolean"),
    ("service-tier-number", CHAT, {"service_tier": 3}, V, "service_tier", "string"),
    # Responses
    ("text-format-name-missing", RESP, tf(schema=OBJ), V, "text.format.name", "name"),
    ("text-format-schema-missing", RESP, tf(name="x"), V, "text.format.schema",
     "JSON Schema object"),
    ("text-format-schema-list", RESP, tf(name="x", schema=[OBJ]), V, "text.format.schema",
     "got list"),
    ("text-format-strict-string", RESP, tf(name="x", schema=OBJ, strict=1), V,
     "text.format.strict", "boolean"),
    ("text-format-not", RESP, tf(name="x", schema=NOT), U, "text.format.schema", "not"),
    ("text-format-bad-type", RESP, tf(name="x", schema={"type": 5}), S, "text.format.schema",
     "type"),
    ("resp-retention-bad", RESP, {"prompt_cache_retention": "1h"}, V,
     "prompt_cache_retention", "'1h'"),
    ("resp-cache-options-bad", RESP, {"prompt_cache_options": {"ttl": "soon"}}, V,
     "prompt_cache_options.ttl", "'soon'"),
    ("resp-cache-options-negative", RESP, {"prompt_cache_options": {"ttl": -1}}, V,
     "prompt_cache_options.ttl", "-1"),
    ("resp-cache-options-over-the-api-cap", RESP, {"prompt_cache_options": {"ttl": 90000}}, V,
     "prompt_cache_options.ttl", "[1, 86400]"),
    ("resp-allowed-unknown", RESP, {"tools": [{"type": "function", "name": "ls"}],
     "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [
      {"type": "function", "name": "rm"}]}}, V, "tool_choice.tools.0", "'rm'"),
    ("resp-service-tier-number", RESP, {"service_tier": 1}, V, "service_tier", "string"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "fields", "code", "param", "needle"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_field_is_named(
    client: TestClient, url: str, fields: dict[str, Any], code: str, param: str, needle: str
) -> None:
    body = {**(GOOD if url == CHAT else RGOOD), **fields}
    err = check_error(client.post(url, json=body), 400, code, needle)
    assert err["param"] == param


def test_fields_without_effect_are_accepted_and_retention_is_reported(
    client: TestClient,
) -> None:
    r = client.post(CHAT, json={**GOOD, "metadata": {"k": "v"}, "store": True,
                                "service_tier": "auto", "prompt_cache_retention": "24h",
                                "prompt_cache_options": {"ttl": 600}})  # fmt: skip
    assert r.status_code == 200, r.text
    kept = r.json()["agentcache"]["cache_control"]
    got = (kept["requested_ttl_s"], kept["granted_ttl_s"], kept["retained_ttl_s"])
    assert got == (86400, 3600, 3600) and kept["enforced"]
    r = client.post(RESP, json={**RGOOD, "prompt_cache_retention": "in_memory"})
    assert r.json()["agentcache"]["cache_control"]["requested_ttl_s"] == 300


def test_logprobs_are_the_chosen_tokens(client: TestClient) -> None:
    body = {**GOOD, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    choice = client.post(CHAT, json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6
    for step in content:
        top = step["top_logprobs"]
        assert len(top) == 3 and top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]
        assert step["logprob"] <= 0 and math.isclose(step["logprob"], top[0]["logprob"])
        assert step["token"] == top[0]["token"]  # greedy: the chosen token is the likeliest
    plain = client.post(CHAT, json={**body, "logprobs": False, "top_logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["message"] == choice["message"]  # recording changes nothing
    events = client.post(CHAT, json={**body, "stream": True}).text.split("\n\n")
    finals = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    streamed = [c["choices"][0]["logprobs"] for c in finals if c["choices"]][-1]["content"]

    # the same tokens; the logprobs equal up to float rounding (the second request may find
    # the prompt's KV the first computed, which differs in the last digits)
    def entries(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [t for s in steps for t in (s, *s["top_logprobs"])]

    pairs = list(zip(entries(streamed), entries(content), strict=True))
    assert all(a["token"] == b["token"] for a, b in pairs)
    assert all(math.isclose(a["logprob"], b["logprob"], abs_tol=1e-4) for a, b in pairs)


def test_logprobs_under_a_grammar_are_json_numbers(client: TestClient) -> None:
    """A JSON reply's first token can only open the value, so the tokens after it in
    `top_logprobs` have no chance: -inf, which JSON cannot carry (it was a 500). They come
    back as the floor, as many entries as asked, streaming or not, and the chosen tokens'
    logprobs stay finite."""
    from agentcache.chat.logprobs import LOGPROB_FLOOR

    body = {**GOOD, "max_tokens": 4, "logprobs": True, "top_logprobs": 5,
            "response_format": {"type": "json_object"}}  # fmt: skip
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    floors = [t for s in content for t in s["top_logprobs"] if t["logprob"] == LOGPROB_FLOOR]
    assert floors and all(len(s["top_logprobs"]) == 5 for s in content)
    assert all(LOGPROB_FLOOR < s["logprob"] <= 0 for s in content)
    events = client.post(CHAT, json={**body, "stream": True}).text.split("\n\n")
    finals = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    streamed = [c["choices"][0]["logprobs"] for c in finals if c["choices"]][-1]["content"]
    assert all(len(s["top_logprobs"]) == 5 for s in streamed) and "data: [DONE]" in events


def test_parallel_tool_calls_false_keeps_one_call(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    two = '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n' * 2
    body = {**GOOD, "max_tokens": 150, "tools": [fn()]}
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(two))
    both = client.post(CHAT, json=body).json()["choices"][0]["message"]["tool_calls"]
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(two))
    one = client.post(CHAT, json={**body, "parallel_tool_calls": False}).json()
    assert len(both) == 2 and len(one["choices"][0]["message"]["tool_calls"]) == 1
    assert one["choices"][0]["finish_reason"] == "tool_calls"


def test_allowed_tools_offers_only_the_named_ones(client: TestClient) -> None:
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "cat"}}]}}  # fmt: skip
    body = {**GOOD, "max_tokens": 12, "tools": [fn("ls"), fn("cat")], "tool_choice": choice}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    # forced to the one allowed tool: the reply opens a call to it (the tiny model then writes
    # what it writes; max_tokens cuts it)
    content = r.json()["choices"][0]["message"]
    assert '"name": "cat"' in (content["content"] or json.dumps(content.get("tool_calls")))
