"""The step loop over a stand-in for vLLM's `LLMEngine` (no vLLM): several turns from their
own threads are in the engine at once, each gets exactly its own tokens in order and its own
TTFT; a cancel or a raising `on_token` aborts only its request; an engine step that raises
fails every waiting turn, never leaving one hanging. Time is the stand-in's clock: one unit
per engine step that produces tokens."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from agentcache.engines.vllm import loop as loop_module
from agentcache.engines.vllm.loop import EngineStepFailed, StepLoop
from agentcache.runtime.engine import TurnCancelled

EOS = 0
WAIT_S = 30.0  # a turn not done by then is a hang


@dataclass(frozen=True)
class Script:
    """What the stand-in produces for one request (its "sampling parameters"): `tokens`, one
    a step, after `delay` steps without output (a prefill still queued)."""

    tokens: tuple[int, ...]
    delay: int = 0


class BatchEngine:
    """Stands in for `LLMEngine`: steps produce nothing (vLLM scheduling no one) until
    `batch` requests are in, then each step gives every request its next scripted token,
    outputs in reverse order of arrival (routing goes by request id). `fail_at`: the
    productive step that raises."""

    def __init__(self, batch: int, fail_at: int | None = None) -> None:
        self.batch, self.fail_at = batch, fail_at
        self.clock = 0.0
        self.requests: dict[str, tuple[Script, list[int], int]] = {}
        self.max_in = 0
        self.aborted: list[str] = []
        self.steps = 0  # productive steps
        self.gate = threading.Event()
        self.prompts: list[dict[str, Any]] = []  # what each add_request was given

    def add_request(self, rid: str, prompt: dict[str, Any], sp: Script) -> None:
        self.prompts.append(prompt)
        self.requests[rid] = (sp, [], 0)
        self.max_in = max(self.max_in, len(self.requests))
        if len(self.requests) >= self.batch:
            self.gate.set()

    def step(self) -> list[Any]:
        if not self.gate.is_set():
            self.gate.wait(0.01)  # nothing scheduled yet: vLLM's step returns no output
            return []
        self.steps += 1
        self.clock += 1.0
        if self.steps == self.fail_at:
            raise RuntimeError("CUDA error: an illegal memory access")
        outs = []
        for rid, (script, got, waited) in reversed(list(self.requests.items())):
            if waited < script.delay:
                self.requests[rid] = (script, got, waited + 1)
                continue
            got.append(script.tokens[len(got)])
            done = len(got) == len(script.tokens)
            output = SimpleNamespace(token_ids=list(got))
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[output]))
        for out in outs:
            if out.finished:
                del self.requests[out.request_id]
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, rids: list[str]) -> None:
        self.aborted.extend(rids)
        for rid in rids:
            self.requests.pop(rid, None)


@pytest.fixture
def engine() -> BatchEngine:
    return BatchEngine(batch=1)


def make_loop(engine: BatchEngine, monkeypatch: pytest.MonkeyPatch) -> StepLoop:
    monkeypatch.setattr(loop_module, "time", SimpleNamespace(perf_counter=lambda: engine.clock))
    return StepLoop(engine, frozenset({EOS}))


@dataclass
class Turn:
    script: Script
    cancel: threading.Event | None = None
    raise_at: int | None = None  # on_token raises on this token (1-based)
    cancel_at: int | None = None  # on_token sets `cancel` on this token
    streamed: list[int] | None = None
    result: Any = None
    error: BaseException | None = None

    def on_token(self, token: int) -> None:
        assert self.streamed is not None
        self.streamed.append(token)
        if self.raise_at == len(self.streamed):
            raise ConnectionResetError("client gone")
        if self.cancel_at == len(self.streamed):
            assert self.cancel is not None
            self.cancel.set()

    def run(self, loop: StepLoop) -> None:
        self.streamed = []
        try:
            self.result = loop.run([1, 2, 3], self.script, self.on_token, 0.0, self.cancel)
        except BaseException as e:
            self.error = e


def run_all(loop: StepLoop, turns: list[Turn]) -> None:
    threads = [threading.Thread(target=t.run, args=(loop,)) for t in turns]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT_S)
    assert not any(th.is_alive() for th in threads), "a turn hangs"


def test_concurrent_turns_each_get_their_own_tokens_in_order_and_ttft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = BatchEngine(batch=3)
    loop = make_loop(engine, monkeypatch)
    turns = [
        Turn(Script((11, 12, 13, 14, 15))),
        Turn(Script((21, EOS), delay=2)),  # its end-of-sequence id is not streamed
        Turn(Script((31, 32, 33), delay=1)),
    ]
    run_all(loop, turns)
    assert [t.error for t in turns] == [None, None, None]
    assert [t.streamed for t in turns] == [[11, 12, 13, 14, 15], [21], [31, 32, 33]]
    assert [list(t.result.output.outputs[0].token_ids) for t in turns] == [
        [11, 12, 13, 14, 15], [21, EOS], [31, 32, 33],
    ]  # fmt: skip
    # first tokens at productive steps 1, 3, 2; the last at 5, 4, 4
    assert [(t.result.ttft_s, t.result.wall_s) for t in turns] == [(1, 5), (3, 4), (2, 4)]
    assert engine.max_in == 3 and engine.aborted == [] and engine.steps == 5
    assert loop.stats.max_held == 3 and loop.stats.max_stepped == 3
    loop.close()


def test_the_loop_thread_runs_with_the_process_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpenMP's thread count is per thread: the loop thread sets the process's (torch's) count
    before it steps, as vLLM's CPU kernels check it against the count set at start-up."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(loop_module.torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(
        loop_module.torch, "set_num_threads",
        lambda n: calls.append((threading.current_thread().name, n)),
    )  # fmt: skip
    engine = BatchEngine(batch=1)
    loop = make_loop(engine, monkeypatch)
    turn = Turn(Script((11,)))
    run_all(loop, [turn])
    assert turn.error is None and calls == [("agentcache-vllm-steps", 3)]
    loop.close()


def test_a_cancel_aborts_only_its_request_before_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = BatchEngine(batch=3)
    loop = make_loop(engine, monkeypatch)
    leaver = Turn(Script((41, 42, 43, 44, 45, 46)), threading.Event(), cancel_at=2)
    turns = [Turn(Script((11, 12, 13, 14))), leaver, Turn(Script((31, 32, 33, 34, 35)))]
    run_all(loop, turns)
    assert isinstance(leaver.error, TurnCancelled) and leaver.streamed == [41, 42]
    assert len(engine.aborted) == 1
    assert [t.streamed for t in turns] == [[11, 12, 13, 14], [41, 42], [31, 32, 33, 34, 35]]
    assert turns[0].error is None and turns[2].error is None
    loop.close()


def test_a_salted_request_reaches_the_engine_with_its_cache_salt(
    engine: BatchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's prefix cache shares blocks only between requests of one `cache_salt`: a salted
    request carries it, an unsalted one carries none (shared by content, vLLM's default)."""
    loop = make_loop(engine, monkeypatch)
    loop.run([1, 2, 3], Script((5,)), None, salt="tenant-a")
    loop.run([1, 2, 3], Script((5,)), None)
    assert engine.prompts == [{"prompt_token_ids": [1, 2, 3], "cache_salt": "tenant-a"},
                              {"prompt_token_ids": [1, 2, 3]}]  # fmt: skip


def test_a_turn_cancelled_before_it_is_added_never_reaches_the_engine(
    engine: BatchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = make_loop(engine, monkeypatch)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(TurnCancelled):
        loop.run([1, 2, 3], Script((5,)), None, cancel=cancel)
    assert engine.max_in == 0 and engine.steps == 0


def test_a_raising_on_token_aborts_only_its_request(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = BatchEngine(batch=2)
    loop = make_loop(engine, monkeypatch)
    gone = Turn(Script((41, 42, 43, 44)), raise_at=1)
    stays = Turn(Script((11, 12, 13)))
    run_all(loop, [gone, stays])
    assert isinstance(gone.error, ConnectionResetError) and gone.streamed == [41]
    assert len(engine.aborted) == 1 and stays.error is None
    assert stays.streamed == [11, 12, 13] and not engine.has_unfinished_requests()
    loop.close()


def test_an_engine_error_fails_every_waiting_turn_and_the_loop_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = BatchEngine(batch=3, fail_at=2)
    loop = make_loop(engine, monkeypatch)
    turns = [Turn(Script((11, 12, 13))), Turn(Script((21, 22, 23))), Turn(Script((31, 32)))]
    run_all(loop, turns)
    for t in turns:
        assert isinstance(t.error, EngineStepFailed) and "illegal memory" in str(t.error)
        assert t.streamed is not None and len(t.streamed) == 1  # the first step's token
    assert len(set(engine.aborted)) == 3
    after = Turn(Script((51, 52)))  # the loop is still there for what comes next
    run_all(loop, [after])
    assert after.error is None and after.streamed == [51, 52]
    loop.close()


def test_a_closed_loop_fails_what_it_holds_and_refuses_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = BatchEngine(batch=2)  # one turn alone is never stepped: it stays in the engine
    loop = make_loop(engine, monkeypatch)
    turn = Turn(Script((11, 12)))
    thread = threading.Thread(target=turn.run, args=(loop,))
    thread.start()
    while engine.max_in == 0:
        engine.gate.wait(0.001)
    loop.close()
    thread.join(WAIT_S)
    assert not thread.is_alive() and isinstance(turn.error, RuntimeError)
    assert len(engine.aborted) == 1
    with pytest.raises(RuntimeError, match="closed"):
        loop.run([1], Script((5,)), None)
