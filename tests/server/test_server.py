"""The server through the real `openai` client against a live uvicorn on loopback."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from agentcache.decode.config import DecodeConfig
from agentcache.decode.profile import save_profile
from agentcache.model.loading import LoadedModel
from agentcache.runtime import loop as loop_module
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread
from agentcache.testing import scripted_sampler
from tests.decode.conftest import make_profile
from tests.server.conftest import MODEL, tiny_app

SYSTEM = "You are a build agent. Tools: ls, cat, grep, make. Reply with one command. " * 3
USERS = ("list the files", "open the README", "run the tests", "show the failures")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def agent_loop(url: str, task: str, turns: int = 4, max_tokens: int = 8) -> list[Any]:
    """An unmodified OpenAI-client agent: resend the whole history every turn."""
    c = client(url)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    replies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{task}: {USERS[turn % len(USERS)]}"})
        r = c.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=max_tokens,  # type: ignore[arg-type]
        )
        replies.append(r)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return replies


def test_agent_loop_reuses_prompt_tokens_and_matches_full(tiny: LoadedModel) -> None:
    with serve_in_thread(tiny_app(tiny)) as url:
        reused = agent_loop(url, "task")
    with serve_in_thread(tiny_app(tiny, "full")) as url:
        full = agent_loop(url, "task")
    texts = [r.choices[0].message.content for r in reused]
    assert texts == [r.choices[0].message.content for r in full]
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in reused]
    assert cached[0] == 0
    assert all(c > 0 for c in cached[1:])
    last = reused[-1].model_extra["agentcache"]
    assert last["reused_tokens"] == cached[-1]
    split = [last[f"{use}_tokens"] for use in ("exact", "moved", "refreshed", "computed")]
    assert sum(split) == last["prompt_tokens"] and sum(split[:3]) == cached[-1]
    statuses = {s["status"] for s in last["segments"]}
    assert "hit" in statuses  # system prompt and earlier messages found in the store
    # the previous reply (the random model's bytes do not round-trip through text) was never
    # stored: `new`, as the last user message
    misses = [s for s in last["segments"] if s["status"] == "new"]
    assert [(s["role"], s["reason"]) for s in misses] == [("assistant", "new"), ("user", "new")]
    assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in full)


def test_streaming_equals_non_streaming(tiny: LoadedModel) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    with serve_in_thread(tiny_app(tiny)) as url:
        whole = client(url).chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=12,  # type: ignore[arg-type]
        )
    with serve_in_thread(tiny_app(tiny)) as url:
        stream = client(url).chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=12, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    assert finish[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finish[0].model_extra["agentcache"]["prompt_tokens"] == whole.usage.prompt_tokens
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_eight_concurrent_loops_equal_their_solo_runs(tiny: LoadedModel) -> None:
    tasks = [f"project-{i}" for i in range(8)]
    solo = []
    for task in tasks:  # each alone on a fresh server
        with serve_in_thread(tiny_app(tiny)) as url:
            solo.append([r.choices[0].message.content for r in agent_loop(url, task, 3)])
    with serve_in_thread(tiny_app(tiny)) as url, ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda t: agent_loop(url, t, 3), tasks))
    together = [[r.choices[0].message.content for r in run] for run in runs]
    assert together == solo
    assert all(run[-1].usage.prompt_tokens_details.cached_tokens > 0 for run in runs)


def test_conversation_header_and_reuse_headers(server_url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    r = httpx.post(f"{server_url}/v1/chat/completions", json=body,
                   headers={"X-Agentcache-Conversation": "c-42"})  # fmt: skip
    assert r.status_code == 200
    token = r.headers["x-agentcache-conversation"]  # a name the client made up is not used
    assert token.startswith("c1.") and "c-42" not in token
    assert r.json()["agentcache"]["conversation_id"] == token
    assert int(r.headers["x-agentcache-prompt-tokens"]) == r.json()["usage"]["prompt_tokens"]
    assert r.headers["x-agentcache-reused-tokens"] == "0"


def test_models_health_and_metrics(server_url: str) -> None:
    c = client(server_url)
    assert [m.id for m in c.models.list()] == [MODEL]
    assert httpx.get(f"{server_url}/health").json()["status"] == "ok"
    agent_loop(server_url, "metrics", turns=2, max_tokens=4)
    text = httpx.get(f"{server_url}/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['agentcache_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 2
    assert samples["agentcache_ttft_seconds_count"] == 2
    assert samples["agentcache_reused_tokens_total"] > 0
    assert samples["agentcache_recomputed_tokens_total"] > 0
    assert samples['agentcache_cache_hits_total{tier="memory"}'] >= 1
    assert samples['agentcache_cache_misses_total{reason="new"}'] >= 1
    assert samples["agentcache_fallbacks_total"] == 0
    assert samples["agentcache_stream_mismatches_total"] == 0
    assert samples['agentcache_decode_turns_total{fallback="none",policy="dense"}'] == 2
    assert samples["agentcache_shared_pages_total"] == 0  # one turn at a time: none to share
    pages = {k: samples[f'agentcache_kv_pages{{kind="{k}"}}'] for k in
             ("used", "free", "shared", "capacity")}  # fmt: skip
    assert pages["used"] == pages["shared"] == 0 and pages["free"] == pages["capacity"] > 0


def _error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}
    assert {"message", "type", "param", "code"} <= set(body["error"])
    return dict(body["error"])


GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        ({**GOOD, "model": "gpt-9"}, 404, "model_not_found", "gpt-9"),
        ({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value",
         "wizard"),
        ({**GOOD, "max_tokens": 100_000}, 400, "context_length_exceeded", "context"),
        ({**GOOD, "tools": [BAD_TOOL]}, 400, "invalid_tool_schema", "objekt"),
        ({**GOOD, "tools": [{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "properties": {"a": 3}}}}]}, 400,
         "invalid_tool_schema", "properties.a"),
        ({**GOOD, "messages": []}, 400, "invalid_value", "messages"),
        ({**GOOD, "temperature": -1}, 400, "invalid_value", "temperature"),
        # types are strict, as in OpenAI's API: no guessing "yes" is true
        ({**GOOD, "stream": "yes"}, 400, "invalid_value", "stream: Input should be a valid bool"),
        ({**GOOD, "max_tokens": "5"}, 400, "invalid_value", "max_tokens: Input should be a valid"),
        ({**GOOD, "max_tokens": True}, 400, "invalid_value", "max_tokens: Input should be a valid"),
        ({**GOOD, "seed": 2**70}, 400, "invalid_value", "seed: Input should be less than"),
        ({**GOOD, "stop": ""}, 400, "invalid_value", "stop: String should have at least 1"),
        ({**GOOD, "stop": ["x", ""]}, 400, "invalid_value", "stop.1: String should have at least"),
        # the field is named without the union member pydantic tried (`content.str`)
        ({**GOOD, "messages": [{"role": "user", "content": 5}]}, 400, "invalid_value",
         "messages.0.content: Input should be a valid string"),
        ({**GOOD, "tool_choice": "always"}, 400, "invalid_value",
         "tool_choice: Input should be 'none', 'auto' or 'required'"),
    ],
)  # fmt: skip
def test_bad_input_is_a_4xx_with_an_openai_error(
    server_url: str, body: dict[str, Any], status: int, code: str, needle: str
) -> None:
    r = httpx.post(f"{server_url}/v1/chat/completions", json=body)
    assert r.status_code == status
    err = _error(r)
    assert err["code"] == code
    assert needle in err["message"]
    assert httpx.post(f"{server_url}/v1/chat/completions", json=GOOD).status_code == 200


def test_a_request_larger_than_the_kv_pool_is_a_400_before_any_compute(tiny: LoadedModel) -> None:
    """The pool (4 pages of 16 tokens) is what limits the context here, not the model."""
    long = {**GOOD, "messages": [{"role": "user", "content": "word " * 80}]}
    with serve_in_thread(tiny_app(tiny, kv_pages=4)) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json=long)
        assert r.status_code == 400
        err = _error(r)
        assert (err["code"], err["param"]) == ("context_length_exceeded", "max_tokens")
        assert "the engine's KV pool (kv_pages=4 of 16 tokens) holds 64 tokens" in err["message"]
        # no max_tokens: the reply is clamped to what the pool has left (4 of the server's 8)
        short = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 10}]}
        r = httpx.post(f"{url}/v1/chat/completions", json={**short, "temperature": 0})
        assert r.status_code == 200
        usage = r.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (60, 4)
        assert r.json()["choices"][0]["finish_reason"] == "length"


def test_invalid_json_is_a_400_and_the_server_keeps_serving(server_url: str) -> None:
    r = httpx.post(f"{server_url}/v1/chat/completions", content=b'{"model": "tiny", "mess',
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400
    assert _error(r)["code"] == "invalid_json"
    assert httpx.post(f"{server_url}/v1/chat/completions", json=GOOD).status_code == 200


@pytest.mark.parametrize(
    ("content", "content_type", "code", "needle"),
    [
        (b"[1, 2]", "application/json", "invalid_value", "must be a JSON object"),
        (b"null", "application/json", "invalid_value", "must be a JSON object"),
        (b"", "application/json", "invalid_value", "must be a JSON object"),
        (json.dumps(GOOD).encode(), "application/x-www-form-urlencoded", "invalid_value",
         "sent as Content-Type: application/json (got application/x-www-form-urlencoded)"),
        (json.dumps(GOOD).encode()[:-1] + b', "user": "\xff"}', "application/json",
         "invalid_json", "can't decode byte 0xff"),
        (json.dumps({**GOOD, "messages": [{"role": "user", "content": "a\ud800"}]}).encode(),
         "application/json", "invalid_value", "messages.0.content: text is not valid Unicode"),
    ],
    ids=["array", "null", "empty", "form-content-type", "not-utf8", "lone-surrogate"],
)  # fmt: skip
def test_a_body_that_is_not_a_usable_json_object_is_a_400(
    server_url: str, content: bytes, content_type: str, code: str, needle: str
) -> None:
    url = f"{server_url}/v1/chat/completions"
    r = httpx.post(url, content=content, headers={"content-type": content_type})
    assert r.status_code == 400
    err = _error(r)
    assert err["code"] == code
    assert needle in err["message"]
    assert httpx.post(url, json=GOOD).status_code == 200


def test_unknown_paths_and_methods_get_an_openai_error_body(server_url: str) -> None:
    r = httpx.post(f"{server_url}/v1/completion", json=GOOD)
    assert r.status_code == 404
    assert _error(r)["message"].startswith("Not Found: POST /v1/completion; this server serves ")
    r = httpx.get(f"{server_url}/v1/chat/completions")
    assert r.status_code == 405
    assert _error(r)["message"] == "Method Not Allowed: GET /v1/chat/completions"
    assert r.headers["allow"] == "POST"


def test_null_where_openai_allows_it_is_the_default(server_url: str) -> None:
    nulls = {"temperature": None, "top_p": None, "n": None, "stream": None, "seed": None}
    tool = {"type": "function", "function": {"name": "now"}}  # no parameters
    r = httpx.post(f"{server_url}/v1/chat/completions", json={**GOOD, **nulls, "tools": [tool]})
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_the_user_field_names_no_conversation_and_is_never_echoed(server_url: str) -> None:
    tokens = set()
    for _ in range(2):
        r = httpx.post(f"{server_url}/v1/chat/completions", json={**GOOD, "user": "张三\nx"})
        assert r.status_code == 200
        assert "张三" not in r.text and all("%E5" not in v for v in r.headers.values())
        tokens.add(r.headers["X-Agentcache-Conversation"])
    assert len(tokens) == 2  # the same user id twice: two conversations


def test_openai_client_raises_typed_errors(server_url: str) -> None:
    c = client(server_url)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context"):
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=10**6
        )


def test_forced_tool_choice_starts_the_reply_with_the_call(server_url: str) -> None:
    params = {"type": "object", "properties": {"path": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "ls", "parameters": params}}
    choice = {"type": "function", "function": {"name": "ls"}}
    body = {**GOOD, "tools": [tool], "tool_choice": choice}
    r = httpx.post(f"{server_url}/v1/chat/completions", json=body)
    assert r.status_code == 200
    segments = r.json()["agentcache"]["segments"]
    assert [s["reason"] for s in segments if s["status"] == "computed"][-1] == "prefill"
    assert any(s["segment_id"].startswith("__tools__") for s in segments)
    unknown = {**body, "tool_choice": {"type": "function", "function": {"name": "rm"}}}
    r = httpx.post(f"{server_url}/v1/chat/completions", json=unknown)
    assert r.status_code == 400 and "rm" in _error(r)["message"]
    assert json.loads(json.dumps(r.json()))  # a plain JSON body


def test_stop_strings_cut_the_reply_streaming_or_not(server_url: str) -> None:
    c = client(server_url)
    messages = [{"role": "user", "content": "write something"}]
    free = c.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)  # type: ignore[arg-type]
    text = free.choices[0].message.content or ""
    stop = text[5:7]
    assert len(stop) == 2
    cut = c.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=16,
        stop=[stop],  # type: ignore[arg-type]
    )
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    stream = c.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=16,
        stop=[stop],
        stream=True,  # type: ignore[arg-type]
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == (
        cut.choices[0].message.content
    )


def test_sampling_with_a_seed_repeats(server_url: str) -> None:
    c = client(server_url)
    messages = [{"role": "user", "content": "pick a word"}]

    def sample(seed: int) -> str | None:
        r = c.chat.completions.create(
            model=MODEL,
            messages=messages,
            temperature=1.0,
            seed=seed,
            max_tokens=12,  # type: ignore[arg-type]
        )
        return r.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1


def test_a_client_leaving_mid_stream_does_not_stop_the_server(server_url: str) -> None:
    c = client(server_url)
    messages = [{"role": "user", "content": "tell a long story"}]
    stream = c.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=64,
        stream=True,
        temperature=0,  # type: ignore[arg-type]
    )
    next(iter(stream))  # the role chunk
    stream.close()
    r = httpx.post(f"{server_url}/v1/chat/completions", json=GOOD)
    assert r.status_code == 200


def test_tool_call_history_round_trips(server_url: str) -> None:
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "what is here?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "README.md setup.py"},
    ]
    body = {**GOOD, "messages": messages, "tools": [tool]}
    first = httpx.post(f"{server_url}/v1/chat/completions", json=body).json()
    kinds = [(s["role"], s["kind"]) for s in first["agentcache"]["segments"]]
    assert kinds[:5] == [("system", "system"), ("system", "system"), ("user", "fixed"),
                         ("assistant", "fixed"), ("tool", "fixed")]  # fmt: skip
    reply = first["choices"][0]["message"]
    again = {**body, "messages": [*messages, reply, {"role": "user", "content": "and now?"}]}
    second = httpx.post(f"{server_url}/v1/chat/completions", json=again).json()
    segments = second["agentcache"]["segments"]
    by_index = {s["message_index"]: s for s in segments if s["message_index"] is not None}
    # the tool call and its result were stored last turn, and are found
    assert (by_index[2]["kind"], by_index[2]["status"]) == ("fixed", "hit")
    assert (by_index[3]["kind"], by_index[3]["status"]) == ("fixed", "hit")
    assert (by_index[5]["kind"], by_index[5]["status"]) == ("fixed", "new")


def test_a_memgpt_loop_through_the_openai_client_keeps_its_history(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Working memory in the system message, rewritten every turn; the client echoes nothing
    but a `prompt_cache_key`. From the second turn on, >= 80% of the history's tokens are
    cached; the key groups the `changed` label and separates nothing."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": ""}]
    with serve_in_thread(tiny_app(tiny)) as url:
        c = client(url)
        for turn in range(4):
            facts = " ".join(f"Fact {i}: the user likes topic {i * 3}." for i in range(turn + 1))
            messages[0] = {"role": "system", "content": f"{SYSTEM}\nMemory: {facts}"}
            messages.append({"role": "user", "content": f"{USERS[turn]}, please, in src/{turn}"})
            reply = f"ls src/{turn}"  # scripted: it round-trips through text, as a model's does
            monkeypatch.setattr(loop_module, "sample", scripted_sampler(reply))
            r = c.chat.completions.create(
                model=MODEL, messages=messages, temperature=0, max_tokens=16,  # type: ignore[arg-type]
                extra_body={"prompt_cache_key": "agent-7"},
            )  # fmt: skip
            report = r.model_extra["agentcache"]  # type: ignore[index]
            history = [s for s in report["segments"]
                       if s["message_index"] not in (None, 0, len(messages) - 1)]  # fmt: skip
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn > 0:
                assert cached >= 0.8 * sum(s["num_tokens"] for s in history), turn
                assert {s["status"] for s in history} <= {"hit", "moved"}
                assert report["segments"][0]["status"] == "changed"
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        again = c.chat.completions.create(
            model=MODEL, messages=messages[:-1], temperature=0, max_tokens=4,  # type: ignore[arg-type]
            extra_body={"prompt_cache_key": "another-key"},
        )  # fmt: skip
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # a key is no boundary


def test_metrics_count_the_decode_policy_each_turn_ran(tiny: LoadedModel, tmp_path: Path) -> None:
    """Under a sparse policy a turn its budget covers whole decodes densely, counted by why."""
    profile = save_profile(make_profile(tiny), tmp_path / "profile.json")
    decode = DecodeConfig("flexicache", budget_pages=2, profile=profile)  # 2 of a turn's pages
    engine = Engine(tiny, EngineConfig(kv_pages=512, decode=decode))
    app = create_app(engine, ServerConfig(MODEL, default_max_tokens=8))
    messages = [{"role": "user", "content": "hi"}]
    with TestClient(app) as c:
        short = c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
        long = [{"role": "user", "content": "a long question, word after word " * 12}]
        sparse = c.post("/v1/chat/completions", json={"model": MODEL, "messages": long})
        text = c.get("/metrics").text
    assert short.status_code == sparse.status_code == 200
    assert 'agentcache_decode_turns_total{fallback="short",policy="dense"} 1.0' in text
    assert 'agentcache_decode_turns_total{fallback="none",policy="flexicache"} 1.0' in text
