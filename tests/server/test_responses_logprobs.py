"""Logprobs on /v1/responses through the stock `openai` client: `include:
["message.output_text.logprobs"]` and `top_logprobs` put each output_text token's logprob
on its part, in the Responses shape, equal to chat completions' for the same messages (the
reference path), streaming and not; with a tool call, only the text's tokens; bad values are a
400 naming the field."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from agentcache.runtime import loop as loop_module
from agentcache.testing import scripted_sampler
from tests.server.conftest import MODEL
from tests.server.test_responses import LS, SYSTEM, client

INCLUDE: Any = ["message.output_text.logprobs"]


def as_dicts(logprobs: Any) -> list[dict[str, Any]]:
    return [lp.model_dump() if hasattr(lp, "model_dump") else lp for lp in logprobs]


def close(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """The same tokens and bytes, their logprobs equal up to float rounding (a reply whose
    prompt KV was found rather than computed differs in the last digits)."""

    def same(x: dict[str, Any], y: dict[str, Any]) -> bool:
        return (x["token"], x["bytes"]) == (y["token"], y["bytes"]) and math.isclose(
            x["logprob"], y["logprob"], abs_tol=1e-4
        )

    return len(a) == len(b) and all(
        same(x, y)
        and len(x["top_logprobs"]) == len(y["top_logprobs"])
        and all(same(p, q) for p, q in zip(x["top_logprobs"], y["top_logprobs"], strict=True))
        for x, y in zip(a, b, strict=True)
    )


def test_logprobs_equal_chat_completions_streaming_or_not(server_url: str) -> None:
    c = client(server_url)
    ask: Any = {"model": MODEL, "instructions": SYSTEM, "input": "list the files",
                "temperature": 0, "max_output_tokens": 6}  # fmt: skip
    r = c.responses.create(**ask, include=INCLUDE, top_logprobs=3)
    part = r.output[0].content[0]  # type: ignore[union-attr]
    got = as_dicts(part.logprobs)
    chat = c.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3,
        messages=[{"role": "system", "content": SYSTEM},
                  {"role": "user", "content": "list the files"}],
    )  # fmt: skip
    reference = [s.model_dump() for s in chat.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert len(got) == r.usage.output_tokens == 6  # type: ignore[union-attr]
    # the chat completion found the prompt's KV the response computed: equal up to rounding
    assert close(got, reference)
    assert all(len(step["top_logprobs"]) == 3 for step in got)

    plain = c.responses.create(**ask)
    assert plain.output_text == r.output_text  # recording changes nothing
    assert plain.output[0].content[0].logprobs in (None, [])  # type: ignore[union-attr]

    events = list(c.responses.create(**ask, include=INCLUDE, top_logprobs=3, stream=True))
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and close(as_dicts(done[0].logprobs), got)
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    assert close(as_dicts(last.response.output[0].content[0].logprobs), got)  # type: ignore[union-attr]
    part_done = [e for e in events if e.type == "response.content_part.done"]
    assert close(as_dicts(part_done[0].part.logprobs), got)  # type: ignore[union-attr]


def test_top_logprobs_zero_gives_the_chosen_tokens_only(server_url: str) -> None:
    r = client(server_url).responses.create(model=MODEL, input="hi", temperature=0,
                                            max_output_tokens=4, include=INCLUDE)  # fmt: skip
    logprobs = r.output[0].content[0].logprobs  # type: ignore[union-attr]
    assert logprobs is not None and len(logprobs) == 4
    assert all(lp.top_logprobs == [] and lp.logprob <= 0 for lp in logprobs)


def test_with_a_tool_call_only_the_texts_tokens(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = 'Listing.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    monkeypatch.setattr(loop_module, "sample", scripted_sampler(reply))
    r = client(server_url).responses.create(model=MODEL, input="list", tools=[LS],
                                            max_output_tokens=100, include=INCLUDE)  # fmt: skip
    message, call = r.output[0], r.output[1]
    assert message.type == "message" and call.type == "function_call"
    text = message.content[0]  # type: ignore[union-attr]
    tokens = "".join(lp.token for lp in text.logprobs)  # type: ignore[union-attr]
    assert tokens == text.text  # type: ignore[union-attr]
    assert len(text.logprobs) < r.usage.output_tokens  # type: ignore[union-attr, arg-type]


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("include-unknown", {"include": ["message.output_text.logprob"]}, "include.0", "unknown"),
    ("include-number", {"include": [3]}, "include.0", "string"),
    ("include-string", {"include": "message.output_text.logprobs"}, "include", "list"),
    ("top-logprobs-alone", {"top_logprobs": 2}, "top_logprobs", "include"),
    ("top-logprobs-21", {"include": INCLUDE, "top_logprobs": 21}, "top_logprobs", "20"),
    ("top-logprobs-negative", {"include": INCLUDE, "top_logprobs": -1}, "top_logprobs", "0"),
    ("top-logprobs-string", {"include": INCLUDE, "top_logprobs": "3"}, "top_logprobs", "integer"),
    ("top-logprobs-float", {"include": INCLUDE, "top_logprobs": 2.5}, "top_logprobs", "integer"),
]


@pytest.mark.parametrize(("fields", "param", "says"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])  # fmt: skip
def test_a_bad_logprobs_field_is_a_400_naming_it(
    client: TestClient, fields: dict[str, Any], param: str, says: str
) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, **fields}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_other_include_values_name_nothing_produced_and_are_accepted(client: TestClient) -> None:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 2,
            "include": ["reasoning.encrypted_content", "file_search_call.results"]}  # fmt: skip
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert "logprobs" not in r.json()["output"][0]["content"][0]


def test_the_openai_client_sends_what_the_server_reads(server_url: str) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client(server_url).responses.create(model=MODEL, input="hi", top_logprobs=2)
