"""A request whose client leaves while it is being tokenized, or while it waits for a thread
to tokenize it, gives its tokenizing budget back (at once when no tokenizer call runs on its
text, when the call returns otherwise) and never reaches the admission line: it holds no
queued tokens and no slot, and the engine never runs it. Counted in characters, tickets and
tokens generated, never timed."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from agentcache.server import ServerConfig, create_app
from agentcache.server.admission import Budget
from agentcache.server.inprocess import serve_in_thread
from agentcache.server.tokenizing import ClientLeft, tokenize_held
from tests.server.test_turns import BODY, SlowEngine, wait_for

LONG_TEXT = "x" * 1400


class Client:
    """A stand-in for the request: `left` is whether its client has gone."""

    def __init__(self) -> None:
        self.left = False

    async def is_disconnected(self) -> bool:
        return self.left


def test_a_client_that_leaves_before_its_tokenizing_starts_gives_its_characters_back_at_once(
) -> None:  # fmt: skip
    """The one tokenizing thread is busy: the request waits for it, holding its characters;
    its client leaves; the characters come back while the thread is still busy, and the work
    never runs."""

    async def run() -> None:
        budget, pool, busy = Budget(100), ThreadPoolExecutor(1), threading.Event()
        loop = asyncio.get_running_loop()
        blocker = loop.run_in_executor(pool, busy.wait)
        ran: list[int] = []
        client = Client()
        on_pool: Any = lambda f: loop.run_in_executor(pool, f)  # noqa: E731
        task = asyncio.ensure_future(
            tokenize_held(budget, "A", 40, lambda: ran.append(1), client, run=on_pool)  # type: ignore[arg-type]
        )
        await asyncio.sleep(0)
        assert (budget.in_flight, budget.of("A")) == (40, 40)
        client.left = True
        with pytest.raises(ClientLeft):
            await task
        assert (budget.in_flight, budget.of("A")) == (0, 0)  # the thread is still busy
        busy.set()
        await blocker
        await loop.run_in_executor(pool, lambda: None)  # the abandoned job has had its turn
        assert ran == []
        pool.shutdown()

    asyncio.run(run())


def test_a_client_that_leaves_during_the_tokenizer_call_gives_its_characters_back_when_it_returns(
) -> None:  # fmt: skip
    """A tokenizer call cannot be stopped: its characters stay held (the memory it uses is in
    use) until it returns, then come back; the handler gave up at once."""

    async def run() -> None:
        budget, inside, go_on = Budget(100), threading.Event(), threading.Event()
        client = Client()

        def work() -> int:
            inside.set()
            assert go_on.wait(30)
            return 7

        task = asyncio.ensure_future(tokenize_held(budget, "A", 40, work, client))  # type: ignore[arg-type]
        while not inside.is_set():
            await asyncio.sleep(0.01)
        client.left = True
        with pytest.raises(ClientLeft):
            await task
        assert budget.in_flight == 40  # the call still runs
        go_on.set()
        while budget.in_flight:
            await asyncio.sleep(0.01)
        assert budget.of("A") == 0

    asyncio.run(run())


def test_a_cancelled_handler_gives_its_characters_back() -> None:
    async def run() -> None:
        budget, pool, busy = Budget(100), ThreadPoolExecutor(1), threading.Event()
        loop = asyncio.get_running_loop()
        blocker = loop.run_in_executor(pool, busy.wait)
        on_pool: Any = lambda f: loop.run_in_executor(pool, f)  # noqa: E731
        task = asyncio.ensure_future(tokenize_held(budget, "A", 40, lambda: 1, None, run=on_pool))
        await asyncio.sleep(0)
        assert budget.in_flight == 40
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert budget.in_flight == 0
        busy.set()
        await blocker
        pool.shutdown()

    asyncio.run(run())


def raw_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST and leave the connection open (closing it is the client leaving)."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((u.hostname, u.port))
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + data)
    return sock


def metric_line(metrics: str, prefix: str) -> float:
    lines = [ln for ln in metrics.splitlines() if ln.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_over_http_a_client_that_leaves_while_tokenized_holds_nothing_in_line(
    monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The tokenizer is held on a long prompt; its client leaves: the handler answers at once
    (499, counted as cancelled), the characters come back when the call returns, and the
    request never takes a ticket (no queued tokens, no slot) and the engine never runs it."""
    engine = SlowEngine()
    entered, go_on = threading.Event(), threading.Event()
    tokenize = engine.tokenize

    def held(prompt: Any) -> Any:
        if sum(len(s.text) for s in prompt.segments) >= len(LONG_TEXT):
            entered.set()
            assert go_on.wait(60)
        return tokenize(prompt)

    monkeypatch.setattr(engine, "tokenize", held)
    app: Any = create_app(engine, ServerConfig("slow", max_active=1))  # type: ignore[arg-type]
    budget, line = app.state.tokenizing, app.state.line
    body = {**BODY, "messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 50,
            "stream": stream}  # fmt: skip
    gone = 'agentcache_requests_total{endpoint="/v1/chat/completions",status="499"}'
    with serve_in_thread(app) as url:
        sock = raw_post(url, "/v1/chat/completions", body)
        assert entered.wait(60)
        assert budget.in_flight >= len(LONG_TEXT)
        sock.close()
        wait_for(lambda: metric_line(httpx.get(f"{url}/metrics").text, gone) == 1)
        held_after_leaving = budget.in_flight  # the call still runs: its memory is in use
        go_on.set()
        wait_for(lambda: budget.in_flight == 0)
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 2})
        metrics = httpx.get(f"{url}/metrics").text
    assert held_after_leaving >= len(LONG_TEXT)
    assert (line.active, line.waiting, line.waiting_tokens) == (0, 0, 0)
    assert r.status_code == 200 and engine.produced == [2]  # only the second one ran
    assert metric_line(metrics, "agentcache_cancelled_total") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_over_http_a_client_that_leaves_while_in_line_gives_its_place_and_tokens_back(
    stream: bool,
) -> None:
    """One long request holds the only slot; a second waits in line with its prompt tokens;
    its client leaves: its place and tokens are given back while the first still runs."""
    engine = SlowEngine()
    app: Any = create_app(engine, ServerConfig("slow", max_active=1))  # type: ignore[arg-type]
    line = app.state.line
    with serve_in_thread(app) as url:
        busy = raw_post(url, "/v1/chat/completions", {**BODY, "max_tokens": 4000})
        assert engine.started.wait(60)
        waiting = raw_post(url, "/v1/chat/completions", {**BODY, "max_tokens": 5,
                                                         "stream": stream})  # fmt: skip
        wait_for(lambda: line.waiting == 1)
        assert line.waiting_tokens > 0
        waiting.close()
        wait_for(lambda: line.waiting == 0)
        left = (line.waiting_tokens, line.active, list(engine.produced))
        busy.close()
        wait_for(lambda: line.active == 0)
    assert left == (0, 1, [])  # the first still at the engine, nothing else generated
    assert engine.produced[0] < 4000
