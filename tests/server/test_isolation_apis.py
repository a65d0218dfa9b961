"""The attacks of test_isolation.py on /v1/responses and /v1/messages, and what shows that the
tenant scope is what stops them: two API keys and two cache salts share nothing (no
`cached_tokens`, no segment report or work count that depends on the other tenant), a
same-tenant replay never obtains another conversation's token, a stored response is another
salt's 404, and with the tenant scope removed the attack test's checks fail."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentcache.model.loading import LoadedModel
from agentcache.server.inprocess import serve_in_thread
from tests.server.conftest import MODEL
from tests.server.test_isolation import (
    HEADER,
    HOSTILE_SYSTEM,
    KEYS,
    TENANTS,
    VICTIM_SYSTEM,
    keyed_app,
)
from tests.server.test_isolation import post as chat_post
from tests.server.test_isolation import public as chat_public
from tests.server.test_isolation import sys_user as chat_sys_user

QUESTION = "What will the weather be in Paris tomorrow?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSES_TOOL = {"type": "function", "name": "get_forecast", "parameters": SCHEMA,
                  "description": "The weather forecast for a city."}  # fmt: skip
MESSAGES_TOOL = {"name": "get_forecast", "input_schema": SCHEMA,
                 "description": "The weather forecast for a city."}  # fmt: skip
# what differs between two identical requests whatever the tenants: ids, times, tokens
VOLATILE = frozenset({"id", "created_at", "ttft_s", "conversation_id", "segment_id"})


def send(url: str, api: str, system: str, turns: list[tuple[str, str]], key: str,
         cache_salt: str | None = None, token: str | None = None) -> httpx.Response:  # fmt: skip
    """One request of `api` ("responses" or "messages"): a system prompt, the weather tool and
    `turns` as (role, text)."""
    salt = {"cache_salt": cache_salt} if cache_salt else {}
    if api == "responses":
        items = [{"type": "message", "role": r, "content": t} for r, t in turns]
        body: dict[str, Any] = {"model": MODEL, "input": items, "instructions": system,
                                "tools": [RESPONSES_TOOL], "max_output_tokens": 12,
                                "temperature": 0, "store": False, **salt}  # fmt: skip
    else:
        body = {"model": MODEL, "system": system, "tools": [MESSAGES_TOOL], "max_tokens": 12,
                "temperature": 0, "messages": [{"role": r, "content": t} for r, t in turns],
                **salt}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"} | ({HEADER: token} if token else {})
    r = httpx.post(f"{url}/v1/{api}", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def seen_by(r: httpx.Response) -> tuple[Any, dict[str, str]]:
    """The body and the reuse headers (counts and miss reasons), but ids and times."""
    headers = {k: v for k, v in r.headers.items() if k.startswith("x-agentcache-")
               and k not in ("x-agentcache-conversation", "x-agentcache-ttft-ms")}  # fmt: skip
    assert "x-agentcache-misses" in headers
    return strip(r.json()), headers


def cached(r: httpx.Response, api: str) -> int:
    usage = r.json()["usage"]
    if api == "responses":
        return int(usage["input_tokens_details"]["cached_tokens"])
    return int(usage["cache_read_input_tokens"])


def statuses(r: httpx.Response) -> set[str]:
    return {s["status"] for s in r.json()["agentcache"]["segments"]}


APIS = ("responses", "messages")


@pytest.mark.parametrize("how", TENANTS)
@pytest.mark.parametrize("api", APIS)
def test_a_tenant_that_plants_kv_never_changes_another_tenants_reply(
    tiny: LoadedModel, api: str, how: str
) -> None:
    victim, attacker = TENANTS[how]
    question = [("user", QUESTION)]
    with serve_in_thread(keyed_app(tiny)) as alone:
        expected = send(alone, api, VICTIM_SYSTEM, question, **victim)
    with serve_in_thread(keyed_app(tiny)) as shared:
        send(shared, api, HOSTILE_SYSTEM + VICTIM_SYSTEM, question, **attacker)
        send(shared, api, VICTIM_SYSTEM, [*question, ("assistant", "Snow."), *question],
             **attacker)  # fmt: skip
        got = send(shared, api, VICTIM_SYSTEM, question, **victim)
    assert strip(got.json()) == strip(expected.json())
    assert cached(got, api) == 0
    assert statuses(got) == {"new", "computed"}


@pytest.mark.parametrize("how", TENANTS)
@pytest.mark.parametrize("api", APIS)
def test_another_tenants_traffic_changes_nothing_a_tenant_sees(
    tiny: LoadedModel, api: str, how: str
) -> None:
    """The attacker's guesses of the victim's messages: every reply, usage, segment report and
    count of work (tokens computed, recomputed) is the same whether the victim sent them or
    not."""
    victim, attacker = TENANTS[how]
    guesses = [[("user", "My recovery code is 4711.")], [("user", "hello")]]
    seen = []
    for victim_sends in (True, False):
        with serve_in_thread(keyed_app(tiny)) as url:
            if victim_sends:
                send(url, api, VICTIM_SYSTEM, guesses[0], **victim)
            seen.append([seen_by(send(url, api, VICTIM_SYSTEM, g, **attacker))
                         for g in guesses])  # fmt: skip
    assert seen[0] == seen[1]


@pytest.mark.parametrize("api", APIS)
def test_replaying_a_conversation_never_obtains_its_token(tiny: LoadedModel, api: str) -> None:
    """Within one tenant: a client that replays the victim's turns plus the reply they got
    gets a conversation of its own, and the victim's next turn keeps its token and reuse."""
    with serve_in_thread(keyed_app(tiny)) as url:
        turns = [("user", "My recovery code is 4711.")]
        first = send(url, api, VICTIM_SYSTEM, turns, KEYS[0])
        token = first.headers[HEADER]
        reply = first.json()["agentcache"]  # the report; the reply's text follows
        text = first.json()["output"] if api == "responses" else first.json()["content"]
        said = next((b.get("text") or b["content"][0]["text"]) for b in text
                    if b.get("type") in ("text", "message"))  # fmt: skip
        turns += [("assistant", said), ("user", "thanks")]
        for guess in (None, "victim-session", token[:-1] + "x"):
            r = send(url, api, VICTIM_SYSTEM, turns, KEYS[0], token=guess)
            assert r.headers[HEADER] != token
            assert r.json()["agentcache"]["conversation_id"] != token
        nxt = send(url, api, VICTIM_SYSTEM, [*turns, ("user", "and tomorrow?")], KEYS[0],
                   token=token)  # fmt: skip
    assert nxt.headers[HEADER] == token == reply["conversation_id"]
    assert "changed" not in statuses(nxt)
    history = [s for s in nxt.json()["agentcache"]["segments"] if s["message_index"] in (1, 2)]
    assert [s["status"] for s in history] == ["hit", "hit"]


def test_a_stored_response_is_another_salts_404(tiny: LoadedModel) -> None:
    with serve_in_thread(keyed_app(tiny)) as url:
        auth = {"Authorization": f"Bearer {KEYS[0]}"}
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "cache_salt": "victim"}
        r = httpx.post(f"{url}/v1/responses", json=body, headers=auth, timeout=60)
        rid = r.json()["id"]
        follow = {**body, "input": "again", "previous_response_id": rid}
        same = httpx.post(f"{url}/v1/responses", json=follow, headers=auth, timeout=60)
        other = httpx.post(f"{url}/v1/responses", json={**follow, "cache_salt": "attacker"},
                           headers=auth, timeout=60)  # fmt: skip
        unsalted = httpx.post(f"{url}/v1/responses", json={**follow, "cache_salt": None},
                              headers=auth, timeout=60)  # fmt: skip
    assert same.status_code == 200
    for r in (other, unsalted):
        assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (7, "valid string"),
        ({"k": 1}, "valid string"),
        ("", "at least 1"),
        ("k" * 257, "at most 256"),
        (["k"], "valid string"),
    ],
)
def test_a_bad_prompt_cache_key_on_responses_is_a_400_naming_it(
    tiny: LoadedModel, value: Any, says: str
) -> None:
    with serve_in_thread(keyed_app(tiny)) as url:
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "prompt_cache_key": value}
        r = httpx.post(f"{url}/v1/responses", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {KEYS[0]}"})  # fmt: skip
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt_cache_key" and says in err["message"]


def test_a_prompt_cache_key_on_responses_groups_reports(tiny: LoadedModel) -> None:
    with serve_in_thread(keyed_app(tiny)) as url:
        auth = {"Authorization": f"Bearer {KEYS[0]}"}
        body = {"model": MODEL, "max_output_tokens": 2, "prompt_cache_key": "agent-7",
                "store": False, "instructions": VICTIM_SYSTEM}  # fmt: skip
        httpx.post(f"{url}/v1/responses", json={**body, "input": "first"}, headers=auth)
        r = httpx.post(f"{url}/v1/responses", json={**body, "input": "second"}, headers=auth)
    assert "changed" in statuses(r)  # compared with its group's last request


@pytest.mark.parametrize("how", TENANTS)
def test_without_the_tenant_scope_the_attack_checks_fail(
    tiny: LoadedModel, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks of test_isolation.py's HijackKV test, with every request put in one tenant:
    the victim then finds the attacker's KV, so those checks fail (they can fail)."""
    monkeypatch.setattr("agentcache.server.app.tenant_id", lambda key, salt: "")
    victim, attacker = TENANTS[how]
    question = chat_sys_user(VICTIM_SYSTEM, QUESTION)
    with serve_in_thread(keyed_app(tiny)) as alone:
        expected = chat_post(alone, question, **victim)
    with serve_in_thread(keyed_app(tiny)) as shared:
        chat_post(shared, [{"role": "system", "content": HOSTILE_SYSTEM}, *question], **attacker)
        got = chat_post(shared, question, **victim)
    assert int(got.json()["usage"]["prompt_tokens_details"]["cached_tokens"]) > 0
    assert chat_public(got) != chat_public(expected)
