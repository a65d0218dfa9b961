"""Hostile bodies found by mutation: valid requests to every endpoint, each changed in one to
three places (a value swapped for one of another type, size or encoding: lone surrogates,
huge numbers, nested empties; a key dropped or added; a list shuffled or grown), sent as
clients send them (non-ASCII escaped, or as raw bytes). Every reply is a 2xx or a 4xx with
the endpoint's error body, never a 5xx; the seeded run is the same on every machine. The bugs
it found are each a named case in the bad-input tests (logprobs under a grammar, lone
surrogates, a non-string role)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from starlette.testclient import TestClient

from tests.mutation import pick
from tests.server.conftest import MODEL

FN = {"type": "function", "function": {"name": "get", "description": "d", "parameters": {
    "type": "object", "properties": {"x": {"type": "string"}}}}}  # fmt: skip
SEEDS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get", "arguments": "{\"x\": \"1\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "and?"}]}],
     "tools": [FN], "max_tokens": 2, "temperature": 0.5, "stop": ["x"], "seed": 3,
     "prompt_cache_key": "k", "cache_salt": "s", "response_format": {"type": "json_object"},
     "logprobs": True, "top_logprobs": 2, "tool_choice": "auto"}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "d",
                                           "prompt_cache_breakpoint": {"ttl": "5m"}}]},
        {"role": "user", "content": "x"}],
     "tools": [FN], "tool_choice": {"type": "function", "function": {"name": "get"}},
     "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 2,
     "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": 60, "mode": "explicit"},
     "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": True,
         "schema": {"type": "object", "properties": {"a": {"type": "array",
             "items": {"enum": [1, "x"]}}}, "required": ["a"]}}}}),
    ("/v1/responses", {"model": MODEL, "instructions": "be short", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
     "tools": [{"type": "function", "name": "get", "parameters": {"type": "object",
                                                                   "properties": {}}}],
     "max_output_tokens": 2, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
     "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object",
              "properties": {"a": {"type": "integer"}}}}}}),
    ("/v1/messages", {"model": MODEL, "system": [{"type": "text", "text": "sys",
                                                  "cache_control": {"type": "ephemeral"}}],
     "messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                                     "name": "get", "input": {"x": "1"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                "content": "ok"}]}],
     "tools": [{"name": "get", "input_schema": {"type": "object", "properties": {}}}],
     "max_tokens": 2, "tool_choice": {"type": "auto"}, "stop_sequences": ["z"]}),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": [
        {"role": "user", "content": "hi"}]}),
]  # fmt: skip
VALUES: list[Any] = [None, True, 0, -1, 2**63, -(2**63), 1e308, 0.5, "", "x", "\x00", "\ud800",
                     "\udc00x", "é" * 50, "a" * 3000, [], [None], [{}], {}, {"type": None},
                     {"type": "text"}, [[[]]], "NaN"]  # fmt: skip


def mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    b = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        if not b:
            break
        parent, key, op = pick(b, rng)
        if op < 0.6:
            parent[key] = copy.deepcopy(rng.choice(VALUES))
        elif op < 0.75:
            del parent[key]
        elif op < 0.9 and isinstance(target := parent[key], dict):
            target[rng.choice(["type", "role", "content", "name", "text", "id", "zz"])] = (
                copy.deepcopy(rng.choice(VALUES))
            )
        elif isinstance(target := parent[key], list) and target:
            target.append(copy.deepcopy(rng.choice(target)))
            rng.shuffle(target)
    return b


def test_mutated_requests_get_no_5xx(client: TestClient) -> None:
    rng = random.Random(20261207)
    statuses: dict[int, int] = {}
    for _ in range(1200):
        url, seed = rng.choice(SEEDS)
        body = mutate(seed, rng)
        if rng.random() < 0.2 and not url.endswith("count_tokens"):
            body["stream"] = True
        # lone surrogates escaped, as a client's encoder sends them, or as raw bytes
        escaped = rng.random() < 0.5
        content = json.dumps(body, ensure_ascii=escaped).encode("utf-8", "surrogatepass")
        r = client.post(url, content=content, headers={"content-type": "application/json"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (url, content[:2000], r.text[:500])
        if r.status_code >= 400:
            err = r.json()["error"]
            assert isinstance(err, dict) and err["message"], r.text
    # the mutations reach both sides: bodies still served and bodies refused
    assert statuses.get(200, 0) >= 30 and sum(n for s, n in statuses.items() if s >= 400) >= 100
