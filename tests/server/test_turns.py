"""Turns at the engine: a request whose client leaves stops generating, a request past its
deadline gets 504 and stops, a full line gets 503 with Retry-After, tickets keep arrival
order, and `max_active` requests are at the engine at once (a short one passes a long one).
The engine is scripted and slow (a token every few milliseconds), so how far a
generation got is counted in tokens, not timed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from agentcache.runtime.engine import GenerationParams
from agentcache.server import ServerConfig, create_app
from agentcache.server.admission import AdmissionLine, QueueFull
from agentcache.server.inprocess import serve_in_thread
from tests.server.test_serving_engine import ScriptedEngine

LONG = 4000  # tokens a request asks for: minutes at the scripted pace
BODY = {"model": "slow", "messages": [{"role": "user", "content": "tell a long story"}]}


@dataclass
class SlowEngine(ScriptedEngine):
    """Emits token 65 ("A") every `delay_s` until max_new_tokens; records how many each call
    produced before it ended (or was stopped by its `on_token` raising)."""

    delay_s: float = 0.005
    produced: list[int] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def emit(
        self, params: GenerationParams, on_token: Callable[[int], None] | None
    ) -> tuple[int, ...]:
        self.started.set()
        ids: list[int] = []
        try:
            while len(ids) < params.max_new_tokens:
                time.sleep(self.delay_s)
                ids.append(65)
                if on_token is not None:
                    on_token(65)
        finally:
            self.produced.append(len(ids))
        return tuple(ids)


def app(engine: SlowEngine, **config: object) -> object:
    return create_app(engine, ServerConfig("slow", **config))  # type: ignore[arg-type]


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_client_that_gives_up_stops_its_generation() -> None:
    engine = SlowEngine()
    with serve_in_thread(app(engine)) as url:  # type: ignore[arg-type]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": LONG},
                       timeout=0.5)  # fmt: skip
        wait_for(lambda: len(engine.produced) == 1)  # the abandoned request has stopped ...
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 3})
        metrics = httpx.get(f"{url}/metrics").text
    assert r.status_code == 200
    assert engine.produced[0] < LONG // 4  # ... long before its max_tokens
    assert engine.produced[1] == 3
    assert "agentcache_cancelled_total 1.0" in metrics


def test_a_client_that_leaves_a_stream_stops_its_generation() -> None:
    engine = SlowEngine()
    with serve_in_thread(app(engine)) as url:  # type: ignore[arg-type]
        body = {**BODY, "max_tokens": LONG, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            while '"content": "A' not in next(lines):  # the first generated piece
                pass
        wait_for(lambda: len(engine.produced) == 1)
        metrics = httpx.get(f"{url}/metrics").text
    assert engine.produced[0] < LONG // 4
    assert "agentcache_cancelled_total 1.0" in metrics


def test_a_request_past_its_deadline_gets_504_and_stops() -> None:
    engine = SlowEngine()
    with serve_in_thread(app(engine, request_timeout_s=0.3)) as url:  # type: ignore[arg-type]
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": LONG})
        wait_for(lambda: len(engine.produced) == 1)
        metrics = httpx.get(f"{url}/metrics").text
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "timeout"
    assert "--request-timeout 0.3" in r.json()["error"]["message"]
    assert engine.produced[0] < LONG // 4
    assert 'agentcache_requests_total{endpoint="/v1/chat/completions",status="504"} 1.0' in metrics


def test_a_full_line_answers_503_with_retry_after() -> None:
    engine = SlowEngine()
    with serve_in_thread(app(engine, max_queued=0, max_active=1)) as url:  # type: ignore[arg-type]
        long_body = {**BODY, "max_tokens": 200}
        post = lambda: httpx.post(f"{url}/v1/chat/completions", json=long_body, timeout=60)  # noqa: E731
        busy = threading.Thread(target=post)
        busy.start()
        engine.started.wait(30)
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 1})
        s = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 1, "stream": True})
        busy.join()
    for response in (r, s):
        assert response.status_code == 503
        assert response.headers["retry-after"].isdigit()
        assert response.json()["error"]["code"] == "server_overloaded"
    assert engine.produced == [200]


@pytest.mark.parametrize("max_active", [1, 2])
def test_a_short_request_is_not_held_behind_a_long_one(max_active: int) -> None:
    """With room for two requests at the engine, a short one finishes while a long one is still
    generating; with one, it waits for the long one's end."""
    engine = SlowEngine()
    with serve_in_thread(app(engine, max_active=max_active)) as url:  # type: ignore[arg-type]
        body = {**BODY, "max_tokens": 400}
        post = lambda: httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)  # noqa: E731
        long = threading.Thread(target=post)
        long.start()
        engine.started.wait(30)
        during = httpx.get(f"{url}/metrics").text
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 2}, timeout=60)
        finished_before = list(engine.produced)
        long.join()
    assert r.status_code == 200
    assert finished_before == ([2] if max_active == 2 else [400, 2])
    assert "agentcache_requests_active 1.0" in during
    assert "agentcache_requests_waiting 0.0" in during


def test_tickets_are_served_max_active_at_a_time() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=2, max_active=2)
        a, b, c, d = (line.take() for _ in range(4))
        assert a.turn.done() and b.turn.done() and not c.turn.done()
        assert (line.active, line.waiting) == (2, 2)
        assert line.refusal("", 0) is not None
        with pytest.raises(QueueFull):
            line.take()
        d.release()  # gave up waiting: leaves the line, nobody's turn changes
        assert not c.turn.done() and line.waiting == 1 and line.refusal("", 0) is None
        a.release()  # a served ticket leaves: the first waiting one is served
        assert c.turn.done() and line.waiting == 0
        e = line.take()
        assert not e.turn.done()
        c.release()
        assert e.turn.done()

    asyncio.run(run())


def test_tickets_are_served_in_arrival_order() -> None:
    async def run() -> list[int]:
        line = AdmissionLine(max_queued=8)
        order: list[int] = []
        tickets = [line.take() for _ in range(6)]

        async def serve(i: int) -> None:
            await asyncio.wait({tickets[i].turn})
            order.append(i)
            await asyncio.sleep(0)
            tickets[i].release()

        tickets[3].release()  # gave up before its turn: leaves the line
        await asyncio.gather(*(serve(i) for i in (5, 4, 2, 1, 0)))  # started out of order
        return order

    assert asyncio.run(run()) == [0, 1, 2, 4, 5]


def test_the_line_is_bounded() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=2)
        first = line.take()
        waiting = [line.take(), line.take()]
        with pytest.raises(QueueFull):
            line.take()
        first.release()  # the next one's turn; a place in line frees up
        assert waiting[0].turn.done() and not waiting[1].turn.done()
        line.take()

    asyncio.run(run())
