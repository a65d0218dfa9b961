"""ASGI layers in front of the routes, outermost first:

CountResponses   every response counted by status in /metrics; an unhandled exception
                 becomes a counted 500 with an OpenAI error body (never a bare traceback)
Gatekeeper       Host allow-list (loopback binds, against DNS rebinding), then the API key
                 (every path but /health); the key's digest is left in scope["state"]
BodyLimit        body size while reading (nothing over the limit is buffered), JSON
                 nesting depth before any parser sees it, and text that is not valid
                 Unicode (a lone surrogate escape), named by its field
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from agentcache.server.config import ServerLimits, host_name, key_digest
from agentcache.server.errors import ENDPOINTS, APIError, internal_error
from agentcache.server.limits import (
    blank_strings,
    json_depth,
    limit_error,
    lone_surrogate,
    nonfinite_number,
    surrogate_path,
)
from agentcache.server.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"
log = logging.getLogger("agentcache.server")


async def send_error(
    send: Send, err: APIError, headers: Iterable[tuple[str, str]] = (), path: str = ""
) -> None:
    body = json.dumps(err.body(path)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers]
    await send({"type": "http.response.start", "status": err.status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class CountResponses:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status: list[int] = []

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, counted)
        except Exception as e:  # a bug: logged with its traceback, answered as a counted 500
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            failed = True
            if not status:
                await send_error(counted, internal_error(e), path=scope.get("path", ""))
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        code = 500 if failed or not status else status[0]  # a stream that broke counts as 500
        self.metrics.requests.labels(endpoint, str(code)).inc()


class Gatekeeper:
    """`allowed_hosts`: Host names accepted (lower case, no port), None for any; `key_digests`:
    the accepted API keys' `key_digest`s, empty for no authentication; `metrics_digests`: the
    keys that alone may read /metrics (which counts every tenant's traffic), empty for any
    accepted key."""

    def __init__(
        self, app: ASGIApp, allowed_hosts: frozenset[str] | None, key_digests: frozenset[str],
        metrics_digests: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        self.app, self.allowed_hosts, self.key_digests = app, allowed_hosts, key_digests
        self.metrics_digests = metrics_digests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        path = scope.get("path", "")
        if self.allowed_hosts is not None:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                msg = "the Host header names no host this server answers to (a loopback bind "
                msg += "accepts localhost, 127.0.0.1 and [::1]; see --allowed-host)"
                return await send_error(send, APIError(421, msg, "invalid_host"), path=path)
        if path == METRICS_PATH and self.metrics_digests:
            presented = (headers.get(b"authorization", b""), headers.get(b"x-api-key", b""))
            if self._key(*presented, self.metrics_digests) is None:
                msg = "/metrics counts every tenant's traffic: it needs the metrics key "
                msg += "(--metrics-key) as 'Authorization: Bearer <key>'"
                err = APIError(403, msg, "invalid_api_key")
                return await send_error(send, err, path=path)
            return await self.app(scope, receive, send)
        digest = self._key(headers.get(b"authorization", b""), headers.get(b"x-api-key", b""))
        if self.key_digests and digest is None and path not in OPEN_PATHS:
            msg = "missing or invalid API key: send it as 'Authorization: Bearer <key>' or "
            msg += "'x-api-key: <key>'"
            err = APIError(401, msg, "invalid_api_key")
            return await send_error(send, err, [("www-authenticate", "Bearer")], path)
        scope.setdefault("state", {})["key_digest"] = digest
        await self.app(scope, receive, send)

    def _key(
        self, authorization: bytes, x_api_key: bytes, digests: frozenset[str] | None = None
    ) -> str | None:
        """The digest of the presented key (a bearer token, else Anthropic's `x-api-key`)
        when it is one of `digests` (the API keys by default; compared in constant time
        against every key), else None."""
        digests = self.key_digests if digests is None else digests
        scheme, _, key = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            key = x_api_key.decode("latin-1")
        if not key.strip() or not digests:
            return None
        digest = key_digest(key.strip())
        found = False
        for known in digests:
            found |= hmac.compare_digest(digest, known)
        return digest if found else None


class BodyLimit:
    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.limits.max_body_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            err = self._too_big(f"a body of {int(declared)} bytes")
            return await send_error(send, err, path=scope.get("path", ""))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                err = self._too_big(f"a body of over {limit} bytes")
                return await send_error(send, err, path=scope.get("path", ""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        plain = blank_strings(body)  # read by the depth and number scans
        if json_depth(plain, self.limits.max_depth, blanked=True) > self.limits.max_depth:
            what = "the JSON nesting depth of the body"
            err = limit_error(self.limits, "max_depth", what, None)
            return await send_error(send, err, path=scope.get("path", ""))
        if (number := nonfinite_number(plain, blanked=True)) is not None:
            err = APIError(400, f"request body is not valid JSON: {number} is not a finite "
                           "number", "invalid_json")  # fmt: skip
            return await send_error(send, err, path=scope.get("path", ""))
        if lone_surrogate(body) and (field := surrogate_path(body)) is not None:
            err = APIError(400, f"{field or 'body'}: text is not valid Unicode (a UTF-16 "
                           "surrogate escape outside a pair, such as \\ud800 alone)",
                           "invalid_value", field or None)  # fmt: skip
            return await send_error(send, err, path=scope.get("path", ""))
        await self.app(scope, _replay(body, receive), send)

    def _too_big(self, what: str) -> APIError:
        return limit_error(self.limits, "max_body_bytes", what, None)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body, read already, as one message; then the client's own messages (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
