"""Who may talk to the server and what it shows: API keys, the Host allow-list of a loopback
bind, the docs pages, the body limit while reading, and 5xx counting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentcache.cli import build_parser
from agentcache.errors import ConfigError
from agentcache.server import ServerConfig, ServerLimits, create_app
from agentcache.server.cli import server_config
from agentcache.server.config import key_digest
from agentcache.server.middleware import BodyLimit
from tests.conftest import usage_error
from tests.server.test_serving_engine import ScriptedEngine

BODY = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
PATHS = [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions")]


def client(**config: Any) -> TestClient:
    return TestClient(create_app(ScriptedEngine(), ServerConfig("scripted", **config)))


@pytest.fixture
def keyed() -> Iterator[TestClient]:
    with client(api_key_digests=frozenset({key_digest("k1"), key_digest("k2")})) as c:
        yield c


@pytest.mark.parametrize(("method", "path"), PATHS)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "k1", "Basic k1", "Bearer "])
def test_every_endpoint_but_health_needs_a_key(
    keyed: TestClient, method: str, path: str, auth: str | None
) -> None:
    headers = {"authorization": auth} if auth else {}
    r = keyed.request(method, path, json=BODY, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), PATHS)
@pytest.mark.parametrize("key", ["k1", "k2"])
def test_a_right_key_passes(keyed: TestClient, method: str, path: str, key: str) -> None:
    r = keyed.request(method, path, json=BODY, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert keyed.get("/health").status_code == 200  # open, for load balancers


def test_each_key_is_its_own_tenant(keyed: TestClient) -> None:
    first = keyed.post("/v1/chat/completions", json=BODY, headers={"authorization": "Bearer k1"})
    token = first.headers["x-agentcache-conversation"]
    same = {"authorization": "Bearer k1", "x-agentcache-conversation": token}
    other = {"authorization": "Bearer k2", "x-agentcache-conversation": token}
    assert keyed.post("/v1/chat/completions", json=BODY, headers=same).headers[
        "x-agentcache-conversation"] == token  # fmt: skip
    assert keyed.post("/v1/chat/completions", json=BODY, headers=other).headers[
        "x-agentcache-conversation"] != token  # fmt: skip


@pytest.mark.parametrize(
    ("host", "status"),
    [("localhost", 200), ("localhost:8000", 200), ("127.0.0.1:8000", 200), ("[::1]:8000", 200),
     ("LOCALHOST", 200), ("evil.example", 421), ("evil.example:8000", 421),
     ("127.0.0.1.evil.example", 421), ("", 421)],
)  # fmt: skip
def test_a_loopback_bind_answers_loopback_host_names_only(host: str, status: int) -> None:
    args = build_parser().parse_args(["serve", "--host", "127.0.0.1"])
    with TestClient(create_app(ScriptedEngine(), server_config(args, "scripted"))) as c:
        r = c.get("/v1/models", headers={"host": host})
    assert r.status_code == status
    if status == 421:
        assert r.json()["error"]["code"] == "invalid_host"


def test_allowed_hosts_follow_the_bind_address() -> None:
    parse = build_parser().parse_args
    assert server_config(parse(["serve", "--host", "0.0.0.0"]), "m").allowed_hosts is None
    extra = server_config(parse(["serve", "--allowed-host", "Box.lan:80"]), "m").allowed_hosts
    assert extra == {"localhost", "127.0.0.1", "[::1]", "box.lan"}
    assert server_config(parse(["serve", "--host", "::1"]), "m").allowed_hosts is not None


def test_keys_and_secret_come_from_flags_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parse = build_parser().parse_args
    monkeypatch.setenv("AGENTCACHE_API_KEY", "a,b")
    monkeypatch.setenv("AGENTCACHE_CONVERSATION_SECRET", "s" * 16)
    config = server_config(parse(["serve"]), "m")
    assert config.api_key_digests == {key_digest("a"), key_digest("b")}
    assert config.conversation_secret == b"s" * 16
    assert server_config(parse(["serve", "--api-key", "c"]), "m").api_key_digests == {
        key_digest("c")
    }
    monkeypatch.setenv("AGENTCACHE_CONVERSATION_SECRET", "short")
    with pytest.raises(ConfigError, match="16 characters"):
        server_config(parse(["serve"]), "m")


def test_limits_and_turn_settings_come_from_flags() -> None:
    argv = ["serve", "--max-body-bytes", "1000", "--max-messages", "3", "--request-timeout",
            "2.5", "--max-queued", "0", "--conversation-bytes", "4096"]  # fmt: skip
    config = server_config(build_parser().parse_args(argv), "m")
    assert (config.limits.max_body_bytes, config.limits.max_messages) == (1000, 3)
    assert (config.request_timeout_s, config.max_queued, config.tracker_bytes) == (2.5, 0, 4096)


def test_admission_settings_come_from_flags() -> None:
    parse = build_parser().parse_args
    argv = ["serve", "--max-queued-tokens", "500", "--max-tokenizing-chars", "9000",
            "--max-active-per-tenant", "3", "--max-tool-chars", "77"]  # fmt: skip
    config = server_config(parse(argv), "m")
    assert (config.max_queued_tokens, config.max_tokenizing_chars) == (500, 9000)
    assert (config.tenant_slots, config.limits.max_tool_chars) == (3, 77)
    assert server_config(parse(["serve"]), "m").tenant_slots == 14
    with pytest.raises(ConfigError, match="--max-active-per-tenant 5 exceeds --max-active 4"):
        server_config(parse(["serve", "--max-active", "4", "--max-active-per-tenant", "5"]), "m")


def test_max_active_defaults_by_backend_and_rejects_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parse = build_parser().parse_args
    assert server_config(parse(["serve"]), "m").max_active == 16
    with pytest.raises(ValueError, match="needs the engine's max_active"):  # vLLM's own
        server_config(parse(["serve", "--backend", "vllm"]), "m")
    assert server_config(parse(["serve", "--max-active", "7"]), "m").max_active == 7
    with pytest.raises(SystemExit):
        parse(["serve", "--max-active", "0"])
    assert "--max-active" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-active-tokens", "0"], "--max-active-tokens"),
        (["--max-active-tokens", "-5"], "--max-active-tokens"),
        (["--max-active-tokens", "1e9"], "--max-active-tokens"),
        (["--prefill-order", "random"], "--prefill-order"),
        (["--prefill-burst-tokens", "-1"], "--prefill-burst-tokens"),
        (["--prefill-burst-tokens", "lots"], "--prefill-burst-tokens"),
    ],
)
def test_bad_admission_and_order_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    assert flag in usage_error(["serve", *argv], capsys)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_docs_are_off_unless_enabled(path: str) -> None:
    with client() as c:
        assert c.get(path).status_code == 404
    with client(enable_docs=True) as c:
        assert c.get(path).status_code == 200


def test_a_body_over_the_limit_is_refused_without_being_read() -> None:
    """A 30 MB body sent in 1 MiB chunks without a length: the limit stops the reading."""
    reads: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return {"type": "http.request", "body": b"x" * (1 << 20), "more_body": len(reads) < 30}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(*_: Any) -> None:
        raise AssertionError("the app saw a body over the limit")

    limit = BodyLimit(app, ServerLimits(max_body_bytes=4 << 20))  # type: ignore[arg-type]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(limit(scope, receive, send))
    assert len(reads) == 5  # 4 MiB allowed: the fifth chunk passes it, the rest is never read
    assert sent[0]["status"] == 413
    assert "--max-body-bytes 4194304" in json.loads(sent[1]["body"])["error"]["message"]


class BrokenEngine(ScriptedEngine):
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals: /home/model")


@pytest.mark.parametrize("stream", [False, True])
def test_an_unhandled_error_is_a_counted_500_without_a_traceback(stream: bool) -> None:
    app = create_app(BrokenEngine(), ServerConfig("scripted"))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", json={**BODY, "stream": stream})
        metrics = c.get("/metrics").text
    assert "Traceback" not in r.text and "secret internals" not in r.text
    assert "internal error: RuntimeError" in r.text
    assert r.status_code == (200 if stream else 500)  # a stream's status line is out first
    count = 'agentcache_requests_total{endpoint="/v1/chat/completions",status="500"} 1.0'
    assert count in metrics


def test_a_metrics_key_alone_reads_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics counts every tenant's traffic: with --metrics-key, tenants' keys cannot read
    it, and the metrics key is no tenant's key."""
    tenants = frozenset({key_digest("k1"), key_digest("k2")})
    with client(api_key_digests=tenants, metrics_key_digests=frozenset({key_digest("ops")})) as c:
        for auth in (None, "Bearer k1", "Bearer k2", "Bearer op", "Basic ops"):
            headers = {"Authorization": auth} if auth else {}
            r = c.get("/metrics", headers=headers)
            assert r.status_code == 403, auth
            assert "--metrics-key" in r.json()["error"]["message"]
        r = c.get("/metrics", headers={"Authorization": "Bearer ops"})
        assert r.status_code == 200 and "agentcache_requests_total" in r.text
        assert c.get("/metrics", headers={"x-api-key": "ops"}).status_code == 200
        r = c.post("/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer ops"})
        assert r.status_code == 401
        ok = c.post("/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200
    parse = build_parser().parse_args
    config = server_config(parse(["serve", "--metrics-key", "ops"]), "m")
    assert config.metrics_key_digests == {key_digest("ops")}
    monkeypatch.setenv("AGENTCACHE_METRICS_KEY", "a,b")
    assert server_config(parse(["serve"]), "m").metrics_key_digests == {
        key_digest("a"), key_digest("b")}  # fmt: skip
    with pytest.raises(ConfigError, match="--metrics-key"):
        server_config(parse(["serve", "--metrics-key", " "]), "m")
