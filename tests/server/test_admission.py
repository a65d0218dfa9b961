"""Admission shared fairly between tenants and bounded by work: a tenant's many requests
cannot hold another tenant's request behind all of them, the line is bounded by prompt
tokens as well as requests (503 with Retry-After beyond), a tenant holding the most of a full
line gives up its newest place to another, and prompt text is bounded before it is tokenized
(tool descriptions and schemas included). Order and positions are counted, never timed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from agentcache.model.loading import LoadedModel
from agentcache.reuse.prefix import block_chain
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, ServerLimits, create_app
from agentcache.server.admission import AdmissionLine, Budget, QueueFull, Ticket
from agentcache.server.config import key_digest
from agentcache.server.inprocess import serve_in_thread
from tests.server.conftest import MODEL
from tests.server.test_turns import BODY, SlowEngine, wait_for


def served_order(tickets: dict[str, Ticket]) -> list[str]:
    """Release the served ticket, one at a time, and record which ticket is served next."""
    order: list[str] = []
    pending = dict(tickets)
    while pending:
        name = next(n for n, t in pending.items() if t.turn.done())
        order.append(name)
        pending.pop(name).release()
    return order


def test_a_tenant_with_many_waiting_requests_does_not_hold_another_behind_them() -> None:
    async def run() -> list[str]:
        line = AdmissionLine(max_queued=16, max_active=1)
        tickets = {f"a{i}": line.take("A", 1000) for i in range(6)}  # a0 at the engine
        tickets["b0"] = line.take("B", 1)
        tickets["a6"] = line.take("A", 1000)
        tickets["b1"] = line.take("B", 1)
        return served_order(tickets)

    # B's first request waits for the one at the engine only, then the tenants alternate
    assert asyncio.run(run()) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5", "a6"]


def test_a_free_slot_goes_to_the_tenant_with_the_fewest_at_the_engine() -> None:
    async def run() -> tuple[bool, bool]:
        line = AdmissionLine(max_queued=16, max_active=4)
        at_engine = [line.take("A", 100) for _ in range(4)]
        a_waiting = [line.take("A", 100) for _ in range(10)]
        b = line.take("B", 1)
        at_engine[0].release()  # the first slot to free goes to B, not to A's 10 in line
        return b.turn.done(), any(t.turn.done() for t in a_waiting)

    assert asyncio.run(run()) == (True, False)


def test_the_line_is_bounded_by_prompt_tokens() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=100, max_active=1, max_queued_tokens=100)
        line.take("A", 5000)  # served at once: the pool's bound, not the line's, limits it
        line.take("A", 60)
        line.take("A", 30)
        assert line.waiting_tokens == 90
        with pytest.raises(QueueFull, match="--max-queued-tokens 100"):
            line.take("A", 20)
        assert line.refusal("A", 10) is None and line.refusal("A", 11) is not None
        assert line.waiting_of("A") == (2, 90)

    asyncio.run(run())


def test_a_lone_request_waits_whatever_its_tokens() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=4, max_active=1, max_queued_tokens=10)
        line.take("A", 1)
        line.take("A", 500)  # nothing else waits: it may wait
        with pytest.raises(QueueFull):
            line.take("A", 1)

    asyncio.run(run())


def test_a_full_line_makes_room_by_the_tenant_holding_most_of_it() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=4, max_active=1, max_queued_tokens=10_000)
        line.take("A", 10)
        a = [line.take("A", 10) for _ in range(4)]
        assert line.refusal("A", 10) is not None and line.refusal("B", 10) is None
        with pytest.raises(QueueFull):  # A cannot push itself out
            line.take("A", 10)
        b = line.take("B", 10)  # takes the place of A's newest
        assert a[3].turn.done() and isinstance(a[3].turn.exception(), QueueFull)
        assert "another tenant" in str(a[3].turn.exception())
        assert not any(t.turn.done() for t in a[:3]) and not b.turn.done()
        assert line.waiting_of("A") == (3, 30) and line.waiting_of("B") == (1, 10)
        a[3].release()  # a pushed-out ticket's release changes nothing
        assert line.waiting == 4
        line.take("B", 10)  # B (1 of 4) still holds less than A (3 of 4)
        assert line.waiting_of("A") == (2, 20)
        with pytest.raises(QueueFull):  # now equal shares: nobody is pushed
            line.take("B", 10)

    asyncio.run(run())


def test_tokens_decide_whose_place_is_taken() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=100, max_active=1, max_queued_tokens=100)
        line.take("A", 1)
        big = line.take("A", 60)
        small = line.take("A", 40)
        b = line.take("B", 1)  # 101 tokens do not fit: A's newest (40) makes room
        assert isinstance(small.turn.exception(), QueueFull) and not big.turn.done()
        assert line.waiting_tokens == 61 and not b.turn.done()

    asyncio.run(run())


def test_the_tokenizing_budget_is_shared_between_tenants() -> None:
    budget = Budget(100)
    with budget.hold("A", 50):
        # A holds half already
        with pytest.raises(QueueFull, match="--max-tokenizing-chars 100"), budget.hold("A", 1):
            pass
        with budget.hold("B", 40):
            with pytest.raises(QueueFull), budget.hold("C", 11):
                pass
            assert budget.in_flight == 90
    assert budget.in_flight == 0
    with budget.hold("A", 5000):  # alone: the request limits bound it
        pass


def _keys_app(engine: SlowEngine, **config: object) -> object:
    digests = frozenset(key_digest(k) for k in ("key-a", "key-b"))
    return create_app(engine, ServerConfig("slow", api_key_digests=digests, **config))  # type: ignore[arg-type]


def test_over_http_another_keys_request_passes_a_tenants_line() -> None:
    """Tenant A has one long request at the engine and three in line; tenant B's 1-token
    request is the next at the engine, before A's three (counted by what the engine ran)."""
    engine = SlowEngine()
    with serve_in_thread(_keys_app(engine, max_active=1)) as url:

        def post(key: str, max_tokens: int) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": max_tokens},
                              headers={"Authorization": f"Bearer {key}"}, timeout=120)  # fmt: skip

        a = [threading.Thread(target=post, args=("key-a", 600))]
        a[0].start()
        engine.started.wait(30)
        for n in (11, 12, 13):
            a.append(threading.Thread(target=post, args=("key-a", n)))
            a[-1].start()
        auth = {"Authorization": "Bearer key-a"}
        wait_for(lambda: "agentcache_requests_waiting 3.0" in httpx.get(
            f"{url}/metrics", headers=auth).text)  # fmt: skip
        r = post("key-b", 1)
        for t in a:
            t.join()
    assert r.status_code == 200
    assert engine.produced[:2] == [600, 1]
    assert sorted(engine.produced[2:]) == [11, 12, 13]


def test_over_http_a_full_token_line_answers_503_with_retry_after() -> None:
    engine = SlowEngine()
    app = _keys_app(engine, max_active=1, max_queued_tokens=8)
    with serve_in_thread(app) as url:
        auth = {"Authorization": "Bearer key-a"}
        long_body = {**BODY, "max_tokens": 200}
        busy = threading.Thread(target=lambda: httpx.post(
            f"{url}/v1/chat/completions", json=long_body, headers=auth, timeout=60))  # fmt: skip
        busy.start()
        engine.started.wait(30)
        waiting = threading.Thread(target=lambda: httpx.post(
            f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 1}, headers=auth,
            timeout=60))  # fmt: skip
        waiting.start()
        wait_for(lambda: "agentcache_requests_waiting 1.0" in httpx.get(
            f"{url}/metrics", headers=auth).text)  # fmt: skip
        metrics = httpx.get(f"{url}/metrics", headers=auth).text
        r = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 1}, headers=auth)
        s = httpx.post(f"{url}/v1/chat/completions", headers=auth,
                       json={**BODY, "max_tokens": 1, "stream": True})  # fmt: skip
        busy.join()
        waiting.join()
    for response in (r, s):
        assert response.status_code == 503
        assert response.headers["retry-after"].isdigit()
        err = response.json()["error"]
        assert err["code"] == "server_overloaded"
        assert "--max-queued-tokens 8" in err["message"]
    waiting = [
        ln for ln in metrics.splitlines() if ln.startswith("agentcache_requests_waiting_tokens ")
    ]
    assert len(waiting) == 1 and float(waiting[0].split()[1]) > 8  # the one waiting, alone
    assert "agentcache_tokenizing_chars 0.0" in metrics


EMPTY = {"type": "object", "properties": {}}
TOOL = {
    "type": "function",
    "function": {"name": "f", "description": "d" * 300, "parameters": EMPTY},
}


@pytest.fixture(scope="module")
def small_tools(tiny: LoadedModel) -> Iterator[TestClient]:
    engine = Engine(tiny, EngineConfig(kv_pages=64))
    limits = ServerLimits(max_tool_chars=200)
    app = create_app(engine, ServerConfig(MODEL, default_max_tokens=2, limits=limits))
    with TestClient(app) as c:
        yield c


def test_tool_text_is_bounded_before_tokenizing_on_every_api(small_tools: TestClient) -> None:
    user = [{"role": "user", "content": "hi"}]
    description = "d" * 300
    bodies = {
        "/v1/chat/completions": {"model": MODEL, "messages": user, "tools": [TOOL]},
        "/v1/responses": {
            "model": MODEL,
            "input": "hi",
            "tools": [
                {"type": "function", "name": "f", "description": description, "parameters": EMPTY}
            ],
        },
        "/v1/messages": {
            "model": MODEL,
            "max_tokens": 2,
            "messages": user,
            "tools": [
                {"name": "f", "description": description, "input_schema": {"type": "object"}}
            ],
        },
    }
    for path, body in bodies.items():
        r = small_tools.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        text = r.text
        assert "--max-tool-chars 200" in text and "tool names, descriptions" in text, path
        if path != "/v1/messages":
            assert r.json()["error"]["param"] == "tools"
            assert r.json()["error"]["code"] == "limit_exceeded"
    properties = {f"p{i}": {"type": "string"} for i in range(20)}
    schema_heavy = {"type": "object", "properties": properties}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema_heavy}}
    r = small_tools.post("/v1/chat/completions", json={"model": MODEL, "messages": user,
                                                       "tools": [tool]})  # fmt: skip
    assert r.status_code == 400 and "--max-tool-chars" in r.text  # the schema counts too
    ok = {"type": "function", "function": {"name": "f", "description": "short"}}
    r = small_tools.post("/v1/chat/completions", json={"model": MODEL, "messages": user,
                                                       "tools": [ok]})  # fmt: skip
    assert r.status_code == 200, r.text


def test_a_text_that_cannot_fit_the_context_is_refused_before_tokenizing(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its characters alone prove it is more tokens than the context holds: a 400 naming the
    field, and the tokenizer never ran (its calls are counted)."""
    engine = Engine(tiny, EngineConfig(kv_pages=64))
    calls: list[int] = []
    tokenize = engine.tokenize
    monkeypatch.setattr(engine, "tokenize", lambda p: calls.append(1) or tokenize(p))
    app = create_app(engine, ServerConfig(MODEL, default_max_tokens=2))
    longest = max(map(len, engine.tokenizer.vocab))
    huge = "x" * (engine.max_context * longest * 2 + longest * 2 + 1)
    fits = "x" * (engine.max_context // 2)  # too many tokens, but only the tokenizer can tell
    user = [{"role": "user", "content": huge}]
    with TestClient(app) as c:
        anthropic = {"model": MODEL, "max_tokens": 2, "messages": user}
        answers = {
            "messages": c.post("/v1/chat/completions", json={"model": MODEL, "messages": user}),
            "input": c.post("/v1/responses", json={"model": MODEL, "input": huge}),
            "anthropic": c.post("/v1/messages", json=anthropic),
            "count": c.post("/v1/messages/count_tokens", json=anthropic),
        }
        assert not calls
        tokenized = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": fits * 3}]})  # fmt: skip
    for param, r in answers.items():
        assert r.status_code == 400, r.text
        assert "refused before tokenizing" in r.text and f"{len(huge)} characters" in r.text
        if param in ("messages", "input"):
            assert r.json()["error"]["param"] == param
            assert r.json()["error"]["code"] == "context_length_exceeded"
    assert tokenized.status_code == 400 and "before tokenizing" not in tokenized.text
    assert calls == [1]


def test_a_tenant_leaves_slots_free_for_others() -> None:
    """Alone, tenant A holds every slot; B's first request starts at once in one more (the
    slot A holds beyond its share), C's waits for a slot to free and takes it before A's
    waiting ones; while another tenant is at the engine, A waits for its share again."""

    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=4, tenant_slots=3)
        assert line.capacity == 5
        a = [line.take("A", 100) for _ in range(6)]
        assert [t.turn.done() for t in a] == [True, True, True, True, False, False]
        b = line.take("B", 1)  # over the bound by the slot A holds beyond its 3: at once
        assert b.turn.done() and line.active == 5
        c = line.take("C", 1)  # no more than that: C waits
        assert not c.turn.done()
        b.release()  # the free slot goes to C, not to A's waiting ones
        assert c.turn.done() and not a[4].turn.done() and line.active == 5
        c.release()  # A alone again, at the 4 slots
        assert not a[4].turn.done() and line.active == 4
        a[0].release()  # one of A's ends: its next one starts
        assert a[4].turn.done() and not a[5].turn.done()
        b2 = line.take("B", 1)
        assert b2.turn.done() and line.active == 5
        a[1].release()  # B at the engine: A may hold its 3, the fourth slot stays free
        assert not a[5].turn.done() and line.active == 4
        b2.release()  # A alone: every slot again
        assert a[5].turn.done() and line.active == 4

    asyncio.run(run())


def test_tenant_slots_default_to_all_but_an_eighth() -> None:
    assert ServerConfig("m").tenant_slots == 14  # of 16
    assert ServerConfig("m", max_active=4).tenant_slots == 4
    assert ServerConfig("m", max_active=4, max_active_per_tenant=2).tenant_slots == 2
    with pytest.raises(ValueError, match="max_active_per_tenant"):
        ServerConfig("m", max_active=4, max_active_per_tenant=5)


def test_over_http_another_tenants_request_starts_while_one_fills_the_engine() -> None:
    """Tenant A, alone, keeps four long requests at the engine (every slot) and one in line;
    tenant B's short request starts at once over the bound (by the slot A holds beyond its
    share of three) and ends first."""
    engine = SlowEngine()
    app = _keys_app(engine, max_active=4, max_active_per_tenant=3)
    with serve_in_thread(app) as url:

        def post(key: str, max_tokens: int) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": max_tokens},
                              headers={"Authorization": f"Bearer {key}"}, timeout=120)  # fmt: skip

        a = [threading.Thread(target=post, args=("key-a", 400)) for _ in range(5)]
        for t in a:
            t.start()
        auth = {"Authorization": "Bearer key-a"}
        wait_for(lambda: "agentcache_requests_waiting 1.0" in httpx.get(
            f"{url}/metrics", headers=auth).text)  # fmt: skip
        r = post("key-b", 2)
        ended_before = list(engine.produced)
        for t in a:
            t.join()
    assert r.status_code == 200
    assert ended_before == [2]  # B's ended while all of A's were still generating


def test_over_http_the_text_being_tokenized_is_bounded_and_shared(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant A's long prompt is being tokenized (held there by the test); A's second long one
    gets 503, while tenant B's short one is tokenized and answered."""
    engine = Engine(tiny, EngineConfig(kv_pages=256))
    release, entered = threading.Event(), threading.Event()
    tokenize = engine.tokenize

    def held(prompt: object) -> object:
        if sum(len(s.text) for s in prompt.segments) > 1000:  # type: ignore[attr-defined]
            entered.set()
            assert release.wait(60)
        return tokenize(prompt)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "tokenize", held)
    digests = frozenset(key_digest(k) for k in ("key-a", "key-b"))
    config = ServerConfig(MODEL, default_max_tokens=2, api_key_digests=digests,
                          max_tokenizing_chars=3000)  # fmt: skip
    long_body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 1400}]}
    short_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

    def post(url: str, key: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {key}"})  # fmt: skip

    with serve_in_thread(create_app(engine, config)) as url:
        first: list[httpx.Response] = []
        t = threading.Thread(target=lambda: first.append(post(url, "key-a", long_body)))
        t.start()
        assert entered.wait(60)
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer key-a"}).text
        again = post(url, "key-a", long_body)
        other = post(url, "key-b", short_body)
        release.set()
        t.join()
    assert "agentcache_tokenizing_chars 1400.0" in metrics
    assert again.status_code == 503 and again.headers["retry-after"].isdigit()
    assert "--max-tokenizing-chars 3000" in again.json()["error"]["message"]
    assert other.status_code == 200, other.text
    assert first[0].status_code == 200, first[0].text


def test_active_tokens_bound_who_is_served() -> None:
    """With a token bound (the vLLM backend's KV cache), a ticket is served when its reserve
    fits beside the active ones'; one alone is served whatever its size; a ticket that fits
    does not pass the fairer choice waiting for room, but a tenant with nothing at the engine
    is the fairer choice."""

    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=8, max_active_tokens=1000)
        big = line.take("A", 10, reserve=5000)  # alone: served, though over the bound
        b = line.take("B", 10, reserve=500)
        assert big.turn.done() and not b.turn.done() and line.active_tokens == 5000
        big.release()
        assert b.turn.done() and line.active_tokens == 500
        a1 = line.take("A", 10, reserve=600)  # 1100 > 1000: waits
        a2 = line.take("A", 10, reserve=100)  # fits, but behind A's own first
        b2 = line.take("B", 10, reserve=100)  # fits, but A (none at the engine) is fairer
        assert not any(t.turn.done() for t in (a1, a2, b2))
        c = line.take("C", 10, reserve=300)  # fits, none at the engine; so has A, waiting first
        assert not c.turn.done()
        b.release()  # A's 600, C's 300, B's 100; A's second (A holds one) waits for room
        assert a1.turn.done() and b2.turn.done() and c.turn.done() and not a2.turn.done()
        assert line.active_tokens == 1000
        b2.release()
        assert a2.turn.done() and line.active_tokens == 1000

    asyncio.run(run())


def test_a_tenant_holds_its_share_of_the_active_tokens() -> None:
    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=4, tenant_slots=3, max_active_tokens=800)
        assert line.tenant_tokens == 600  # 3 of 4 slots: 3/4 of the tokens
        b0 = line.take("B", 10, reserve=10)  # another tenant at the engine
        a = [line.take("A", 10, reserve=300) for _ in range(3)]
        assert [t.turn.done() for t in a] == [True, True, False]  # 900 > A's 600
        b = line.take("B", 10, reserve=190)  # the room A may not take: at once
        assert b.turn.done() and line.active_tokens == 800
        a[0].release()
        assert a[2].turn.done()
        b0.release()

    asyncio.run(run())


def test_a_tenant_alone_holds_every_token_and_gives_its_excess_to_a_newcomer() -> None:
    """Alone, A holds the whole bound; B's first request is served over it by what A holds
    beyond its share (no more: C waits), B's next waits under the bound, and A's next waits
    for A to be within its share."""

    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=8, tenant_slots=7, max_active_tokens=800)
        assert line.tenant_tokens == 700
        a = [line.take("A", 10, reserve=200) for _ in range(5)]
        assert [t.turn.done() for t in a] == [True, True, True, True, False]
        assert line.active_tokens == 800  # every token: A is alone
        b = line.take("B", 10, reserve=100)  # 900: over the bound by A's 100 beyond 700
        assert b.turn.done() and line.active_tokens == 900
        c = line.take("C", 10, reserve=1)  # 901: beyond what A holds over its share
        assert not c.turn.done()
        c.release()
        b2 = line.take("B", 10, reserve=100)  # B's second: under the bound, it waits
        assert not b2.turn.done()
        a[0].release()  # 700: A at its share, B's second fits (800); A's next would not
        assert b2.turn.done() and not a[4].turn.done() and line.active_tokens == 800
        a[1].release()  # A 400 + 200 within 700, and 800 in all
        assert a[4].turn.done() and line.active_tokens == 800
        for t in (a[2], a[3], a[4], b, b2):
            t.release()
        assert line.active == 0 and line.active_tokens == 0

    asyncio.run(run())


def keys(ids: Iterable[int], scope: str = "") -> tuple[str, ...]:
    """A prompt's prefix block keys as the server makes them (`Turn.blocks`), blocks of 32."""
    return tuple(block_chain(tuple(ids), 32, scope))


def test_prefix_block_keys_name_whole_blocks_of_the_same_tokens_from_the_first() -> None:
    """Key i stands for the first (i + 1) blocks: equal while the prompts agree, different
    from the first block that differs and in another tenant; a part-filled block has none."""
    a = list(range(100))
    b = a[:64] + [7] * 36  # agrees on the first two blocks of 32, differs in the third
    ka, kb = keys(a, "t"), keys(b, "t")
    assert len(ka) == len(kb) == 3  # 100 tokens: three whole blocks, 4 left over
    assert ka[:2] == kb[:2] and ka[2] != kb[2]
    assert len(set(ka)) == 3
    assert not set(keys(a, "u")) & set(ka)  # another tenant shares nothing
    assert keys(a[:31], "t") == ()
    assert keys([*a, 5], "t") == ka  # a token more, no whole block more


def test_shared_prefix_blocks_count_once_among_the_active_tokens() -> None:
    """Two requests of a tenant opening with the same 512 tokens (16 blocks of 32) reserve
    them once, as the engine's prefix cache holds them once: both fit under a bound the sum
    of their reserves exceeds. A third, the same tokens in another tenant, shares nothing and
    waits. The first one's release leaves the shared blocks counted for the second."""

    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=8, max_active_tokens=1000,
                             block_tokens=32)  # fmt: skip
        ids = list(range(512))
        a_keys = keys([*ids, 1, 2], "A")
        a1 = line.take("A", 514, reserve=600, blocks=a_keys)
        assert a1.turn.done() and line.active_tokens == 600
        a2 = line.take("A", 513, reserve=600, blocks=keys([*ids, 3], "A"))
        assert a2.turn.done()  # 600 + 600 - 512 shared = 688 <= 1000
        assert line.active_tokens == 688
        b = line.take("B", 514, reserve=600, blocks=keys([*ids, 1, 2], "B"))
        assert not b.turn.done()  # 688 + 600 > 1000: nothing shared across tenants
        a1.release()
        assert line.active_tokens == 600  # a2's whole reserve: its blocks are still held
        assert not b.turn.done()  # 600 + 600 > 1000
        a2.release()
        assert b.turn.done() and line.active_tokens == 600
        b.release()
        assert line.active_tokens == 0 and line.active == 0

    asyncio.run(run())


def test_a_tenants_share_counts_its_shared_prefix_blocks_once() -> None:
    """The tenant's bound (its share of the tokens) counts its own shared blocks once too."""

    async def run() -> None:
        line = AdmissionLine(max_queued=16, max_active=4, tenant_slots=2,
                             max_active_tokens=1600, block_tokens=32)  # fmt: skip
        assert line.tenant_tokens == 800
        line.take("B", 10, reserve=10)  # another tenant at the engine: A holds its share
        blocks = keys(range(320), "A")  # 10 blocks
        a = [line.take("A", 330, reserve=500, blocks=blocks) for _ in range(2)]
        assert all(t.turn.done() for t in a)  # 500 + 500 - 320 = 680 <= 800
        unshared = line.take("A", 330, reserve=500)
        assert not unshared.turn.done()  # A at its 2 slots

    asyncio.run(run())


def test_prefix_blocks_need_the_lines_block_size_and_fit_the_reserve() -> None:
    async def run() -> None:
        blocks = keys(range(64))
        with pytest.raises(ValueError, match="without block_tokens"):
            AdmissionLine(max_queued=4, max_active=2, max_active_tokens=100).take(
                "A", 64, 70, blocks
            )
        line = AdmissionLine(max_queued=4, max_active=2, max_active_tokens=100, block_tokens=32)
        with pytest.raises(ValueError, match="exceed the reserve"):
            line.take("A", 60, 60, blocks)  # 2 blocks of 32 > a reserve of 60
        assert line.active == 0 and line.waiting == 0
        with pytest.raises(ValueError, match="block_tokens"):
            AdmissionLine(max_queued=4, max_active=2, block_tokens=0)

    asyncio.run(run())


@pytest.mark.parametrize("blocks", [32, None])
def test_over_http_requests_sharing_a_system_prompt_reserve_it_once(blocks: int | None) -> None:
    """--max-active-tokens 3000, two requests of a tenant opening with the same ~2000-token
    system prompt, each reserving ~2250 tokens: with the engine's prefix blocks counted once
    (the vLLM backend's `prefix_block_tokens`) both are at the engine at once; counted whole,
    the second waits for the first."""
    engine = SlowEngine()
    system = "You keep the shop's ledger; answer in one line. " * 42  # about 2000 bytes
    body = {**BODY, "messages": [{"role": "system", "content": system}, *BODY["messages"]],
            "max_tokens": 200}  # fmt: skip
    config = {"max_active": 4, "max_active_tokens": 3000, "prefix_block_tokens": blocks}
    with serve_in_thread(_keys_app(engine, **config)) as url:
        auth = {"Authorization": "Bearer key-a"}

        def post() -> None:
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=120)

        threads = [threading.Thread(target=post) for _ in range(2)]
        threads[0].start()
        engine.started.wait(30)
        threads[1].start()
        want = "agentcache_requests_active 2.0" if blocks else "agentcache_requests_waiting 1.0"
        wait_for(lambda: want in httpx.get(f"{url}/metrics", headers=auth).text)
        metrics = httpx.get(f"{url}/metrics", headers=auth).text
        for t in threads:
            t.join()
    line = next(
        ln for ln in metrics.splitlines() if ln.startswith("agentcache_requests_active_tokens ")
    )
    held = float(line.split()[1])
    if blocks:
        assert 2200 < held <= 3000  # one reserve and the second's unshared tail
    else:
        assert "agentcache_requests_active 1.0" in metrics and 2000 < held < 3000
    assert engine.produced == [200, 200]


def test_over_http_a_request_waits_for_room_in_the_active_tokens() -> None:
    """--max-active-tokens 1000: tenant A's request reserving ~620 tokens (prompt + max_tokens
    600) is at the engine; tenant B's of the same size waits although slots are free, and
    runs once A's has ended."""
    engine = SlowEngine()
    with serve_in_thread(_keys_app(engine, max_active=4, max_active_tokens=1000)) as url:

        def post(key: str) -> None:
            httpx.post(f"{url}/v1/chat/completions", json={**BODY, "max_tokens": 600},
                       headers={"Authorization": f"Bearer {key}"}, timeout=120)  # fmt: skip

        a = threading.Thread(target=post, args=("key-a",))
        a.start()
        engine.started.wait(30)
        b = threading.Thread(target=post, args=("key-b",))
        b.start()
        auth = {"Authorization": "Bearer key-a"}
        wait_for(lambda: "agentcache_requests_waiting 1.0" in httpx.get(
            f"{url}/metrics", headers=auth).text)  # fmt: skip
        metrics = httpx.get(f"{url}/metrics", headers=auth).text
        a.join()
        b.join()
    assert "agentcache_requests_active 1.0" in metrics
    line = next(
        ln for ln in metrics.splitlines() if ln.startswith("agentcache_requests_active_tokens ")
    )
    assert 600 < float(line.split()[1]) < 1000  # A's prompt + 600
    assert engine.produced == [600, 600]
