"""Retention through the server: the cache controls of each API (OpenAI
`prompt_cache_breakpoint`, `prompt_cache_options`, `prompt_cache_retention`; Anthropic
`cache_control`) become a retention that is granted up to --max-retention, enforced by pins in
the store and reported (`agentcache.cache_control`, /metrics); each malformed one is a 400
naming the field."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.cli import build_parser
from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.cli import server_config
from agentcache.server.config import key_digest
from tests.conftest import usage_error
from tests.server.conftest import MODEL, tiny_app
from tests.server.test_bad_input import check_error

CHAT, RESP, MSG = "/v1/chat/completions", "/v1/responses", "/v1/messages"
V = "invalid_value"
BP = {"mode": "explicit"}


def chat(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "hi there"}, *parts]
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": content}], **fields}  # fmt: skip


def resp(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "hi there"}, *parts]
    return {"model": MODEL, "max_output_tokens": 2,
            "input": [{"role": "user", "content": content}], **fields}  # fmt: skip


def marked(kind: str, mark: Any) -> dict[str, Any]:
    return {"type": kind, "text": " more", "prompt_cache_breakpoint": mark}


P0 = "messages.0.content.1.prompt_cache_breakpoint"
I0 = "input.0.content.1.prompt_cache_breakpoint"
CASES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("bp-string", CHAT, chat(marked("text", "explicit")), P0, "object is required"),
    ("bp-list", CHAT, chat(marked("text", [BP])), P0, "got list"),
    ("bp-no-mode", CHAT, chat(marked("text", {})), f"{P0}.mode", "'explicit'"),
    ("bp-mode-implicit", CHAT, chat(marked("text", {"mode": "implicit"})), f"{P0}.mode",
     "'implicit'"),
    ("bp-ttl-5m", CHAT, chat(marked("text", {**BP, "ttl": "5m"})), f"{P0}.ttl", "'5m'"),
    ("bp-ttl-seconds", CHAT, chat(marked("text", {**BP, "ttl": 1800})), f"{P0}.ttl", "1800"),
    ("bp-ttl-negative", CHAT, chat(marked("text", {**BP, "ttl": "-30m"})), f"{P0}.ttl",
     "'-30m'"),
    ("bp-unknown-field", CHAT, chat(marked("text", {**BP, "scope": "org"})), f"{P0}.scope",
     "unknown field"),
    ("options-mode", CHAT, chat(prompt_cache_options={"mode": "auto"}),
     "prompt_cache_options.mode", "'auto'"),
    ("options-ttl-negative", CHAT, chat(prompt_cache_options={"ttl": -30}),
     "prompt_cache_options.ttl", "-30"),
    ("options-ttl-not-a-duration", CHAT, chat(prompt_cache_options={"ttl": "soon"}),
     "prompt_cache_options.ttl", "'soon'"),
    ("resp-bp-ttl", RESP, resp(marked("input_text", {**BP, "ttl": "1d"})), f"{I0}.ttl",
     "'1d'"),
    ("resp-bp-mode", RESP, resp(marked("input_text", {"mode": True})), f"{I0}.mode", "True"),
    ("resp-bp-on-output", RESP,
     {"model": MODEL, "max_output_tokens": 2, "input": [
         {"role": "user", "content": "hi"},
         {"role": "assistant", "content": [marked("output_text", BP)]},
         {"role": "user", "content": "again"}]},
     "input.1.content.0.prompt_cache_breakpoint", "input text parts only"),
    ("resp-options-mode", RESP, resp(prompt_cache_options={"mode": 1}),
     "prompt_cache_options.mode", "'implicit' or 'explicit'"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "body", "param", "needle"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_a_bad_cache_control_is_a_400_naming_the_field(
    client: TestClient, url: str, body: dict[str, Any], param: str, needle: str
) -> None:
    err = check_error(client.post(url, json=body), 400, V, needle)
    assert err["param"] == param and err["message"].startswith(f"{param}: ")


def test_a_negative_anthropic_ttl_is_a_400_naming_the_mark(client: TestClient) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "hi",
                        "cache_control": {"type": "ephemeral", "ttl": "-5m"},
                    }
                ],
            }
        ],
    }
    r = client.post(MSG, json=body)
    assert r.status_code == 400 and "Traceback" not in r.text
    assert "messages.0.content.0.cache_control.ttl" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def kept(tiny: LoadedModel) -> Iterator[TestClient]:
    """A server with a cap of 600 s on retention."""
    with TestClient(tiny_app(tiny, kv_pages=64, max_retention_s=600)) as c:
        yield c


def test_breakpoints_are_counted_and_their_ttl_is_granted_up_to_the_cap(
    kept: TestClient,
) -> None:
    body = chat(marked("text", {**BP, "ttl": "12h"}), marked("text", BP),
                prompt_cache_options={"mode": "explicit", "ttl": "30m"})  # fmt: skip
    r = kept.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    cc = r.json()["agentcache"]["cache_control"]
    assert (cc["breakpoints"], cc["requested_ttl_s"], cc["granted_ttl_s"]) == (2, 43200, 600)
    assert cc["enforced"] and cc["retention_source"] == "request"
    assert cc["retained_ttl_s"] == 600 and cc["pinned_segments"] > 0 and cc["pinned_bytes"] > 0
    r = kept.post(RESP, json=resp(marked("input_text", BP)))
    cc = r.json()["agentcache"]["cache_control"]
    assert (cc["breakpoints"], cc["requested_ttl_s"], cc["enforced"]) == (1, None, False)
    assert cc["retention_source"] == "none" and cc["pinned_segments"] == 0


@pytest.mark.parametrize(
    ("url", "fields", "requested"),
    [(CHAT, {"prompt_cache_retention": "24h"}, 86400),
     (RESP, {"prompt_cache_retention": "24h"}, 86400),
     (CHAT, {"prompt_cache_options": {"ttl": "12h"}}, 43200),
     (CHAT, {"prompt_cache_options": {"ttl": 5000}}, 5000),  # whole seconds
     (RESP, {"prompt_cache_options": {"ttl": 86400}}, 86400)],
)  # fmt: skip
def test_a_valid_retention_above_the_cap_is_granted_up_to_it_and_reported(
    kept: TestClient, url: str, fields: dict[str, Any], requested: int
) -> None:
    """API values and numbers of seconds alike: never an error, capped at --max-retention
    (600 here), what was asked and what was granted both reported."""
    body = chat(**fields) if url == CHAT else resp(**fields)
    r = kept.post(url, json=body)
    assert r.status_code == 200, r.text
    cc = r.json()["agentcache"]["cache_control"]
    assert (cc["requested_ttl_s"], cc["granted_ttl_s"], cc["retained_ttl_s"]) == (
        requested, 600, 600)  # fmt: skip
    assert cc["retention_source"] == "request" and cc["enforced"]


def test_a_marked_request_gets_the_same_reply_as_an_unmarked_one(kept: TestClient) -> None:
    plain = chat(temperature=0)
    mark = chat(marked("text", BP), temperature=0)
    mark["messages"][0]["content"][1].pop("prompt_cache_breakpoint")
    unmarked = kept.post(CHAT, json=mark).json()["choices"][0]["message"]["content"]
    mark = chat(marked("text", {**BP, "ttl": "30m"}), temperature=0)
    got = kept.post(CHAT, json=mark).json()["choices"][0]["message"]["content"]
    assert got == unmarked
    assert kept.post(CHAT, json=plain).status_code == 200


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_retained_bytes_are_in_the_metrics_and_a_tenant_reports_only_its_own(
    tiny: LoadedModel,
) -> None:
    keys = ("key-a", "key-b")
    app = tiny_app(tiny, kv_pages=64, api_key_digests=frozenset(map(key_digest, keys)),
                   retention_share=0.5)  # fmt: skip
    with TestClient(app) as c:
        auth = [{"Authorization": f"Bearer {k}"} for k in keys]
        before = c.get("/metrics", headers=auth[0]).text
        assert metric(before, 'agentcache_retained{kind="bytes"}') == 0
        body = chat(prompt_cache_retention="in_memory")
        a = c.post(CHAT, json=body, headers=auth[0]).json()["agentcache"]["cache_control"]
        assert a["enforced"] and a["pinned_bytes"] > 0
        text = c.get("/metrics", headers=auth[0]).text
        assert metric(text, 'agentcache_retained{kind="bytes"}') == a["pinned_bytes"]
        assert metric(text, 'agentcache_retained{kind="segments"}') == a["pinned_segments"]
        assert metric(text, 'agentcache_retained_turns_total{source="request"}') == 1
        cap = metric(text, 'agentcache_retained{kind="cap_bytes"}')
        assert cap == int(0.5 * app.state.chat.engine.store.capacity_bytes)
        # the same messages from tenant b: its own entries, none of a's pins in its report
        b = c.post(CHAT, json=chat(), headers=auth[1]).json()["agentcache"]["cache_control"]
        assert b["pinned_segments"] == 0 and b["pinned_bytes"] == 0
        assert b["retention_source"] == "none" and b["resumed_after_s"] is None


def test_the_retention_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="pinned_share"):
        ServerConfig(MODEL, retention_share=1.5)
    for bad_share in (0.0, 1.5):
        with pytest.raises(ValueError, match="tenant_share"):
            ServerConfig(MODEL, retention_tenant_share=bad_share)
    config = ServerConfig(MODEL, max_retention_s=30, retention_default_s=60)
    assert (config.retention.default_s, config.retention.max_s) == (30, 30)


def test_the_retention_flags_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    default = server_config(parse(["serve"]), "m").retention
    assert (default.default_s, default.max_s, default.pinned_share) == (60, 3600, 0.25)
    assert default.tenant_share == 0.5  # one tenant holds at most half the share
    argv = ["serve", "--max-retention", "120", "--retention-default", "300",
            "--retention-share", "0.1", "--retention-tenant-share", "0.25"]  # fmt: skip
    c = server_config(parse(argv), "m").retention
    assert (c.default_s, c.max_s, c.pinned_share) == (120, 120, 0.1)  # the default capped
    assert c.tenant_share == 0.25
    assert "a number from 0 to 1" in usage_error(["serve", "--retention-share", "1.5"], capsys)
    for bad_share in ("0", "1.5", "half"):
        why = usage_error(["serve", "--retention-tenant-share", bad_share], capsys)
        assert "--retention-tenant-share" in why
        assert "above 0 and at most 1" in why or "a number from 0 to 1" in why
    assert "--retention-default" in usage_error(["serve", "--retention-default", "-1"], capsys)


def test_the_tenant_reservation_flag_reaches_the_config_and_is_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parse = build_parser().parse_args
    assert server_config(parse(["serve"]), "m").retention.reserve == 0.25  # a quarter each
    low = ["serve", "--retention-tenant-share", "0.1"]  # the default follows a lower part
    assert server_config(parse(low), "m").retention.reserve == 0.1
    argv = ["serve", "--retention-tenant-reserve", "0"]
    assert server_config(parse(argv), "m").retention.reserve == 0.0
    over = ["serve", "--retention-tenant-share", "0.3", "--retention-tenant-reserve", "0.4"]
    with pytest.raises(ConfigError, match=r"--retention-tenant-reserve 0\.4 exceeds"):
        server_config(parse(over), "m")
    for bad in ("-0.1", "1.5", "most"):
        why = usage_error(["serve", "--retention-tenant-reserve", bad], capsys)
        assert "--retention-tenant-reserve" in why
    with pytest.raises(ValueError, match="tenant_reserve"):
        ServerConfig(MODEL, retention_tenant_share=0.3, retention_tenant_reserve=0.5)


# ---- a tool-call turn kept across its pause, through the HTTP API ----

LS = {"type": "function", "function": {
    "name": "ls", "description": "list files", "strict": True,
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}  # fmt: skip
FORCE_LS = {"type": "function", "function": {"name": "ls"}}


def opening(name: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"You are agent {name}. " * 6},
            {"role": "user", "content": f"task for {name}: list the files"}]  # fmt: skip


def call_ls(c: TestClient, name: str, auth: dict[str, str] | None = None) -> dict[str, Any]:
    """A conversation's first turn, its reply forced to be a call of `ls`."""
    body = {"model": MODEL, "messages": opening(name), "tools": [LS], "tool_choice": FORCE_LS,
            "max_tokens": 40, "temperature": 0}  # fmt: skip
    r = c.post(CHAT, json=body, headers=auth or {})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    return out


def tool_app(tiny: LoadedModel, store_bytes: int, **config: Any) -> Any:
    engine = Engine(tiny, EngineConfig(kv_pages=256, store_bytes=store_bytes))
    return create_app(engine, ServerConfig(MODEL, default_max_tokens=2, **config))


def one_conversation(tiny: LoadedModel) -> int:
    """What the store holds after one opening turn ending in a tool call (all the same size)."""
    app = tool_app(tiny, 1 << 30)
    with TestClient(app) as c:
        call_ls(c, "A")
    return int(app.state.chat.engine.store.stats.bytes)


def press(c: TestClient, n: int) -> None:
    """`n` other conversations of the same tenant, no tools, each a long message of its own."""
    for i in range(n):
        words = " ".join(f"w{i}x{j}" for j in range(150))
        body = {"model": MODEL, "messages": [{"role": "user", "content": words}]}
        assert c.post(CHAT, json=body).status_code == 200


@pytest.mark.parametrize("share", [1.0, 0.0])
def test_a_tool_call_turn_is_kept_across_its_pause_under_pressure(
    tiny: LoadedModel, share: float
) -> None:
    """A's reply is a tool call (forced): the turn is retained for the learned time. Other
    conversations of the tenant then fill the store several times over; A's next request
    (the call and its result resent) loads A's history: cached_tokens counts every token the
    first turn stored. The reference, with --retention-share 0 (retention off), loads none."""
    one = one_conversation(tiny)
    app = tool_app(tiny, int(2.5 * one), retention_share=share)
    store = app.state.chat.engine.store
    with TestClient(app) as c:
        first = call_ls(c, "A")
        kept = first["agentcache"]["cache_control"]
        press(c, 12)
        assert store.stats.evictions > 0
        call = first["choices"][0]["message"]
        result = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                  "content": "a.txt b.txt"}  # fmt: skip
        body = {"model": MODEL, "messages": [*opening("A"), call, result], "tools": [LS]}
        again = c.post(CHAT, json=body).json()
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the first prompt's messages and tools block (its forced call's opening is a prefill,
    # computed and not stored)
    stored = sum(s["num_tokens"] for s in first["agentcache"]["segments"] if s["status"] == "new")
    assert kept["retention_source"] == "learned" and kept["retained_ttl_s"] == 60
    assert again["agentcache"]["cache_control"]["resumed_after_s"] is not None
    if share > 0:
        assert kept["enforced"] and kept["pinned_segments"] > 0
        assert kept["refused_segments"] == 0
        assert cached >= stored > 0  # every message the first turn stored, loaded
    else:  # retention off: reported as not enforced, and A was evicted like the others
        assert not kept["enforced"] and kept["pinned_segments"] == 0
        segments = again["agentcache"]["segments"]
        assert not any(s["status"] in ("hit", "moved") for s in segments)
        # all that is cached: openings (heads) A's messages share with the other
        # conversations' messages stored after the same context, their chat framing
        assert cached == sum(s["exact_tokens"] for s in segments if s["status"] != "computed")
        assert cached < 0.1 * stored


def test_one_tenant_fills_only_its_part_of_the_share_over_http(tiny: LoadedModel) -> None:
    """Tenant A pauses three conversations in a share that holds two, a tenant's part one
    (--retention-tenant-share 0.5): the turns past its part report `tenant_refused_segments`,
    /metrics counts them, and tenant B's pause is still pinned whole."""
    one = one_conversation(tiny)
    keys = ("key-a", "key-b")
    app = tool_app(tiny, 4 * one + 1, retention_share=0.5, retention_tenant_share=0.5,
                   api_key_digests=frozenset(map(key_digest, keys)))  # fmt: skip
    with TestClient(app) as c:
        auth = [{"Authorization": f"Bearer {k}"} for k in keys]
        a = [call_ls(c, name, auth[0])["agentcache"]["cache_control"] for name in "ACD"]
        b = call_ls(c, "B", auth[1])["agentcache"]["cache_control"]
        text = c.get("/metrics", headers=auth[0]).text
    refused = sum(r["tenant_refused_segments"] for r in a)
    assert a[0]["tenant_refused_segments"] == 0 and refused > 0
    assert metric(text, 'agentcache_retained{kind="refused_tenant"}') == refused
    assert b["pinned_segments"] > 0 and b["refused_segments"] == 0
    assert metric(text, 'agentcache_retained{kind="preempted"}') == 0  # room without it


def test_a_third_tenant_gets_its_reservation_over_http(tiny: LoadedModel) -> None:
    """Tenants A and B fill a share that holds two conversations (each its part, one); C's
    pause still gets pins (its reservation, a quarter) by ending A's and B's beyond theirs,
    counted in /metrics only: A's and B's reports of their own turns are what they were."""
    one = one_conversation(tiny)
    keys = ("key-a", "key-b", "key-c")
    app = tool_app(tiny, 4 * one + 1, retention_share=0.5, retention_tenant_share=0.5,
                   api_key_digests=frozenset(map(key_digest, keys)))  # fmt: skip
    with TestClient(app) as c:
        auth = [{"Authorization": f"Bearer {k}"} for k in keys]
        a = call_ls(c, "A", auth[0])["agentcache"]["cache_control"]
        b = call_ls(c, "B", auth[1])["agentcache"]["cache_control"]
        before = c.get("/metrics", headers=auth[0]).text
        third = call_ls(c, "C", auth[2])["agentcache"]["cache_control"]
        text = c.get("/metrics", headers=auth[0]).text
    assert a["pinned_segments"] > 0 and b["pinned_segments"] > 0
    assert metric(before, 'agentcache_retained{kind="preempted"}') == 0
    assert third["pinned_segments"] > 0 and third["enforced"]
    assert metric(text, 'agentcache_retained{kind="preempted"}') > 0
    assert "preempted" not in str(third)  # another tenant's pins are not named to C
