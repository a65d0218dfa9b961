"""Threads sharing one engine: turns interleave token by token, in arrival order, each with the
outputs it gets alone; a turn waits for pages rather than finding the pool empty mid-decode."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from agentcache.errors import ConfigError
from agentcache.kv.pool import PagePool, PoolConfig, SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.runtime.sharing import FairLock
from tests.conftest import at_once

WAIT_S = 30.0
LONG = GenerationParams(max_new_tokens=40)
SHORT = GenerationParams(max_new_tokens=4)


def prompt(i: int, user: str = "list the files") -> SegmentedPrompt:
    """Conversation `i`'s prompt; no two conversations share text (so none reuses another's)."""
    return SegmentedPrompt([
        Segment(SegmentKind.SYSTEM, f"You are agent number {i}. Answer briefly. " * 2, "sys",
                "system"),
        Segment(SegmentKind.UPDATE, f"{user} (conversation {i})", "new", "user"),
    ])  # fmt: skip


def alone(model: LoadedModel, p: SegmentedPrompt, params: GenerationParams) -> Generation:
    return Engine(model, EngineConfig(kv_pages=128)).generate(p, params)


def test_a_short_turn_runs_while_a_long_one_decodes(tiny: LoadedModel) -> None:
    """The long turn waits, between two of its tokens, for the short one to finish: possible
    only if the engine is not held for the long turn's whole generation."""
    engine = Engine(tiny, EngineConfig(kv_pages=128))
    short_done = threading.Event()
    results: dict[str, Generation] = {}

    def short() -> None:
        results["short"] = engine.generate(prompt(1), SHORT)
        short_done.set()

    helper = threading.Thread(target=short)
    seen: list[bool] = []

    def on_token(token: int) -> None:
        if not seen:
            helper.start()
            seen.append(short_done.wait(WAIT_S))

    results["long"] = engine.generate(prompt(0), LONG, on_token=on_token)
    helper.join()
    assert seen == [True]
    assert engine.gate.peak_running == 2
    assert results["long"].token_ids == alone(tiny, prompt(0), LONG).token_ids
    assert results["short"].token_ids == alone(tiny, prompt(1), SHORT).token_ids
    assert engine.ctx.pool.num_free == engine.ctx.pool.config.num_pages


@pytest.mark.parametrize(
    ("strategy", "order"), [("prefix", "arrival"), ("rpdc", "arrival"), ("rpdc", "shortest")]
)
def test_concurrent_conversations_get_their_solo_outputs(
    tiny: LoadedModel, strategy: str, order: str
) -> None:  # fmt: skip
    users = ("list the files", "open README.md", "summarise it")
    params = GenerationParams(max_new_tokens=12)

    def conversation(engine: Engine, i: int) -> list[tuple[int, ...]]:
        history: list[Segment] = []
        out = []
        for t, user in enumerate(users):
            p = prompt(i, user)
            segs = [p.segments[0], *history, p.segments[1]]
            gen = engine.generate(SegmentedPrompt(segs), params, strategy)
            out.append(gen.token_ids)
            history += [Segment(SegmentKind.FIXED, f"{user} ({i})", f"u{t}", "user"),
                        Segment(SegmentKind.FIXED, gen.text, f"a{t}", "assistant")]  # fmt: skip
        return out

    solo = [conversation(Engine(tiny, EngineConfig(kv_pages=128)), i) for i in range(4)]
    shared = Engine(tiny, EngineConfig(kv_pages=128, prefill_order=order))
    assert at_once(lambda i: conversation(shared, i), 4) == solo
    assert shared.gate.peak_running >= 1
    assert shared.ctx.pool.num_free == shared.ctx.pool.config.num_pages


def test_a_turn_waits_for_pages_instead_of_running_out(tiny: LoadedModel) -> None:
    """A pool that holds one turn's pages: the second turn waits for the first to finish."""
    p0, p1 = prompt(0), prompt(1)
    probe = Engine(tiny, EngineConfig(kv_pages=128))
    pages = max(probe._pages_for(probe.tokenize(p), LONG) for p in (p0, p1))
    engine = Engine(tiny, EngineConfig(kv_pages=pages + pages // 2))
    results: dict[str, Generation] = {}
    second = threading.Thread(target=lambda: results.__setitem__("1", engine.generate(p1, LONG)))
    started: list[int] = []

    def on_token(token: int) -> None:
        if not started:
            second.start()
            started.append(1)
            wait_until(lambda: engine.gate.waited == 1)  # it found the pool short

    results["0"] = engine.generate(p0, LONG, on_token=on_token)
    second.join()
    assert engine.gate.peak_running == 1
    assert results["0"].token_ids == alone(tiny, p0, LONG).token_ids
    assert results["1"].token_ids == alone(tiny, p1, LONG).token_ids


def test_a_stopped_turn_gives_its_pages_back(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=128))

    def stop(token: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.generate(prompt(0), LONG, on_token=stop)
    assert engine.ctx.pool.num_free == 128 and engine.gate.running == 0
    assert engine.generate(prompt(0), SHORT).token_ids == alone(tiny, prompt(0), SHORT).token_ids


def wait_until(condition: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def queue_then_release(lock: FairLock, names: list[str]) -> list[str]:
    """Hold `lock`, queue one thread per name in that order (a name starting with "f" asks
    `first()`, "p<n>" is a prefill of n tokens), release it; the order in which they got it."""
    order: list[str] = []
    lock.acquire()
    threads = []
    for i, name in enumerate(names):

        def take(name: str = name) -> None:
            if name.startswith("f"):
                unit = lock.first()
            else:
                unit = lock.prefill(int(name[1:])) if name.startswith("p") else lock
            with unit:
                order.append(name)

        th = threading.Thread(target=take)
        th.start()
        threads.append(th)
        wait_until(lambda i=i: lock.waiting == i + 1)
    lock.release()
    for th in threads:
        th.join()
    return order


def test_the_lock_goes_to_waiting_threads_in_arrival_order() -> None:
    assert queue_then_release(FairLock(), ["n0", "n1", "n2", "n3"]) == ["n0", "n1", "n2", "n3"]


def test_a_first_asker_goes_ahead_once_in_turn_with_the_others() -> None:
    """`first()` (a batched decode step) goes ahead of threads waiting in arrival order, but
    not twice in a row: first askers and the others alternate while both wait, each kind in
    its own arrival order."""
    order = queue_then_release(FairLock(), ["n1", "n2", "f1", "f2", "n3"])
    assert order == ["f1", "n1", "f2", "n2", "n3"]


def test_prefills_go_shortest_first_among_those_before_another_unit() -> None:
    """With `shortest_first`, the prefills waiting ahead of the first other unit go fewest
    tokens first; the other unit is passed by none that came after it; off, arrival order."""
    names = ["p300", "p100", "n1", "p200", "p50"]
    shortest = queue_then_release(FairLock(shortest_first=True), names)
    assert shortest == ["p100", "p300", "n1", "p50", "p200"]
    assert queue_then_release(FairLock(), names) == names


def test_a_prefill_first_in_line_goes_after_max_passes_shorter_ones() -> None:
    names = ["p900", "p10", "p20", "p30", "p40"]
    order = queue_then_release(FairLock(shortest_first=True, max_passes=2), names)
    assert order == ["p10", "p20", "p900", "p30", "p40"]


def test_first_askers_still_alternate_with_prefills_in_shortest_order() -> None:
    order = queue_then_release(FairLock(shortest_first=True), ["p300", "p100", "f1", "f2"])
    assert order == ["f1", "p100", "f2", "p300"]


def test_prefills_run_back_to_back_between_steps_while_they_fit_the_burst() -> None:
    """With `burst_tokens`, prefills go ahead of a waiting `first()` asker (a decode step)
    while the costs run since the last one fit; the one that does not fit goes after it; a
    unit that is not a prefill (a page gate's look) goes within the burst at no cost."""
    lock = FairLock(burst_tokens=400)
    assert queue_then_release(lock, ["p100", "n1", "p200", "f1", "p300", "p50"]) == [
        "p100", "n1", "p200", "f1", "p300", "p50"]  # fmt: skip
    off = queue_then_release(FairLock(), ["p100", "n1", "p200", "f1", "p300", "p50"])
    assert off == ["f1", "p100", "n1", "p200", "p300", "p50"]  # alternation, as before


def test_a_burst_takes_the_shortest_prefills_and_at_least_one_after_a_step() -> None:
    order = queue_then_release(
        FairLock(shortest_first=True, burst_tokens=400), ["p300", "p100", "f1", "p200", "p50"]
    )
    assert order == ["p50", "p100", "p200", "f1", "p300"]
    # a prefill over the burst waits for the step in line, then runs (at least one per step)
    order = queue_then_release(FairLock(burst_tokens=100), ["p500", "f1", "p20", "f2"])
    assert order == ["f1", "p500", "f2", "p20"]


def test_a_negative_burst_is_refused() -> None:
    with pytest.raises(ValueError, match="burst_tokens"):
        FairLock(burst_tokens=-1)


def test_the_lock_is_reentrant_and_only_its_holder_releases_it() -> None:
    lock = FairLock()
    with lock, lock:
        errors: list[BaseException] = []

        def other() -> None:
            try:
                lock.release()
            except RuntimeError as e:
                errors.append(e)

        th = threading.Thread(target=other)
        th.start()
        th.join()
    assert len(errors) == 1 and "does not hold it" in str(errors[0])
    with pytest.raises(RuntimeError):
        lock.release()
    got = threading.Event()
    th = threading.Thread(target=lambda: (lock.acquire(), got.set(), lock.release()))
    th.start()
    th.join(WAIT_S)
    assert got.is_set()  # released fully after two exits


def test_pages_are_taken_as_one_run_where_the_pool_has_one() -> None:
    pool = PagePool(PoolConfig(1, 1, 2, num_pages=10, page_size=4))
    held = [pool.allocate(1)[0] for _ in range(10)]
    pool.release([held[i] for i in (1, 3, 4, 6, 7, 8)])  # free: 1, 3-4, 6-8
    assert pool.allocate_run(3) == [6, 7, 8]
    assert pool.allocate_run(2) == [3, 4]
    with pytest.raises(Exception, match="need 2 KV pages"):
        pool.allocate_run(2)  # only page 1 is free
    pool.release([held[i] for i in (0, 2, 5, 9)] + [3, 4])  # free: 0-5, 9 and page 1
    seq = SequenceKV(pool)
    seq.reserve(4)
    seq.extend(13)  # 4 pages of 4 slots, all reserved ones
    assert seq.table.pages == [0, 1, 2, 3] and seq.spans() == [(0, 13)]
    assert pool.num_free == 3
    seq.extend(4)  # past the reservation: taken on demand
    assert len(seq.table.pages) == 5
    seq.free()
    assert pool.num_free == 7


def test_a_prefills_cost_is_the_text_the_store_lacks(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=128))  # shortest first: the default
    first = engine.tokenize(prompt(0))
    assert engine._prefill_cost(first) == first.num_tokens + 1  # nothing stored yet
    engine.generate(prompt(0), SHORT)
    again = engine.tokenize(prompt(0, "open README.md"))
    user = again.segments[1]  # the system prompt and the generation prompt are stored
    assert engine._prefill_cost(again) == user.end - user.start + 1
    arrival = Engine(tiny, EngineConfig(kv_pages=128, prefill_order="arrival"))
    assert arrival._prefill_cost(first) == 0  # not used


@pytest.mark.parametrize("bad", [-1, 1.5, True, "512"])
def test_a_bad_prefill_burst_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="prefill_burst_tokens must be a whole number"):
        EngineConfig(prefill_burst_tokens=bad)  # type: ignore[arg-type]


def test_an_unknown_prefill_order_is_refused() -> None:
    with pytest.raises(ConfigError, match="prefill_order must be one of arrival, shortest"):
        EngineConfig(prefill_order="random")
