"""The step driver's cancellation, over a stand-in for vLLM's `LLMEngine` (no vLLM): a set
`cancel` aborts the request before the next engine step, and a request cancelled before it
is added never reaches the engine; `VLLMBackend.generate` hands its `cancel` to the driver.
Counted in engine steps, never timed."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentcache.engines.vllm.backend import VLLMBackend
from agentcache.engines.vllm.driver import StepDriver
from agentcache.engines.vllm.fill import FillDecision
from agentcache.model.tokenizer import ByteTokenizer, chat_format_for
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import tokenize_prompt
from agentcache.runtime.engine import GenerationParams, TurnCancelled

EOS = 0


class SteppedEngine:
    """Stands in for `LLMEngine`: each `step` gives every unfinished request one more token
    (65), finishing it after `length`; counts steps, records aborts."""

    def __init__(self, length: int = 50) -> None:
        self.length = length
        self.requests: dict[str, list[int]] = {}
        self.steps = 0
        self.aborted: list[str] = []

    def add_request(self, rid: str, prompt: dict[str, Any], sp: Any) -> None:
        self.requests[rid] = []

    def step(self) -> list[Any]:
        self.steps += 1
        outs = []
        for rid, ids in self.requests.items():
            ids.append(65)
            done = len(ids) >= self.length
            output = SimpleNamespace(token_ids=list(ids))
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[output]))
        self.requests = {r: ids for r, ids in self.requests.items() if len(ids) < self.length}
        return outs

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, rids: list[str]) -> None:
        self.aborted.extend(rids)
        for rid in rids:
            self.requests.pop(rid, None)


def driver(engine: SteppedEngine, tmp_path: Path) -> StepDriver:
    return StepDriver(engine, frozenset({EOS}), tmp_path, "key")


def test_a_request_cancelled_between_steps_is_aborted_before_the_next(tmp_path: Path) -> None:
    engine, cancel = SteppedEngine(), threading.Event()
    got: list[int] = []

    def on_token(token: int) -> None:  # the client leaves once the first token is out
        got.append(token)
        cancel.set()

    with pytest.raises(TurnCancelled):
        driver(engine, tmp_path).run([1, 2, 3], None, on_token, cancel=cancel)
    assert got == [65] and engine.steps == 1  # no step after the cancel
    assert len(engine.aborted) == 1 and not engine.has_unfinished_requests()


def test_a_request_cancelled_before_it_is_added_never_reaches_the_engine(tmp_path: Path) -> None:
    engine, cancel = SteppedEngine(), threading.Event()
    cancel.set()
    with pytest.raises(TurnCancelled):
        driver(engine, tmp_path).run([1, 2, 3], None, None, cancel=cancel)
    assert engine.requests == {} and engine.steps == 0 and engine.aborted == []


def test_an_unset_cancel_changes_nothing(tmp_path: Path) -> None:
    engine = SteppedEngine(length=4)
    out, _, _ = driver(engine, tmp_path).run([1, 2, 3], None, None, cancel=threading.Event())
    assert out.finished and engine.steps == 4 and engine.aborted == []


def test_the_backend_hands_its_cancel_to_the_driver(tmp_path: Path) -> None:
    """`generate` with the connector's engine filling (no vLLM: the sampling parameters and
    the fill decision stand in): a cancel set after the first token aborts the request."""
    engine, cancel = SteppedEngine(), threading.Event()
    backend: Any = object.__new__(VLLMBackend)
    backend._decide_lock = threading.Lock()
    decision = FillDecision(None, "engine", False)
    backend.decider = SimpleNamespace(decide=lambda tokens, strategy: decision)
    backend.sampling_params = lambda *args, **kwargs: None
    backend.driver = driver(engine, tmp_path)
    tok = ByteTokenizer()
    prompt = SegmentedPrompt([Segment(SegmentKind.UPDATE, "hello", "u", "user")])
    tokens = tokenize_prompt(prompt, tok, chat_format_for(tok.vocab), 4096)
    with pytest.raises(TurnCancelled):
        backend.generate(tokens, GenerationParams(max_new_tokens=20),
                         on_token=lambda token: cancel.set(), cancel=cancel)  # fmt: skip
    assert engine.steps == 1 and len(engine.aborted) == 1
