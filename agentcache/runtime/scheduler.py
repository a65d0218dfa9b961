"""Continuous batching of decoding turns: one step advances every running turn by a token.

    thread A  generate: [admit] [prefill+commit] join -> tokens ... leave
    thread B  generate:      [admit]   wait   [prefill+commit] join -> tokens ... leave
    step k    choose a token for each turn (its own sampling, stops, max_new_tokens)
              -> finished turns leave -> feed the others: dense ones as one batch
              (`batch_step.batched_dense_step`), any other decoder on its own; a dense
              turn alone in its step takes the one-sequence step (`decode.dense.dense_step`,
              what the engine runs without batching), so a lone request decodes at its speed
    step k+1  turns that joined since step k take part; turns cancelled since leave

There is no scheduler thread: a turn's thread that finds no token ready runs the next step
itself unless another thread is running one, and waits otherwise. Each step, like each prefill,
holds the engine's lock, so prefills and steps alternate in arrival order (a prefill runs as
its own unit before its turn joins the batch).

Alone and batched, a row's logits agree to fp32 rounding (a one-row matmul sums in another
order than the padded batch's, `batch_step`), not bit for bit: a turn that decodes partly
alone and partly in a batch gets the greedy ids it gets alone unless two logits tie to that
rounding (`tests/runtime/test_scheduler.py`, `benchmarks/batch_decode.py` compare them).

A step never calls back into the caller: chosen tokens go to each turn's `out`, and the
turn's own thread hands them to its `on_token` (which may raise: the turn then leaves).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentcache.decode.base import Decoder
from agentcache.decode.dense import DenseDecoder, dense_step, reads_in_place
from agentcache.errors import OutOfPagesError
from agentcache.model.llama import LlamaForward
from agentcache.runtime.batch_step import batched_dense_step
from agentcache.runtime.loop import TurnDecoding
from agentcache.runtime.sharing import FairLock


@dataclass(eq=False)
class Running:
    """One turn in the batch: its decode state and decoder, and what its thread has not read."""

    turn: TurnDecoding
    decoder: Decoder
    out: deque[int] = field(default_factory=deque)
    finished: bool = False  # set by a step: `turn.finish` is final, or `error` is set
    error: BaseException | None = None
    left: bool = False  # set by the turn's thread: no step may touch it any more


@dataclass(frozen=True)
class BatchStats:
    steps: int  # scheduler steps run
    batched_rows: int  # tokens fed through batched steps
    solo_feeds: int  # tokens fed one turn at a time (decoders other than the in-place dense)
    peak_batch: int  # most turns in one step
    lone_steps: int = 0  # tokens of a dense turn that decoded alone (the one-sequence step)


class BatchScheduler:
    """Owns the running turns of one engine. Thread-safe: `join`, `tokens` and `leave` are
    called from each turn's thread; `step` holds the engine's `lock`."""

    def __init__(self, forward: LlamaForward, lock: FairLock) -> None:
        self.forward, self._lock = forward, lock
        self._batchable = reads_in_place(forward)
        self._cond = threading.Condition(threading.Lock())
        self._joining: list[Running] = []
        self._active: list[Running] = []
        self._in_flight: list[Running] = []
        self._stepping = False
        self._steps = self._rows = self._solo = self._peak = self._lone = 0

    def stats(self) -> BatchStats:
        with self._cond:
            return BatchStats(self._steps, self._rows, self._solo, self._peak, self._lone)

    @property
    def running(self) -> int:
        with self._cond:
            return len(self._active) + len(self._joining)

    def join(self, turn: TurnDecoding, decoder: Decoder) -> Running:
        """Add a prefilled turn; it takes part from the next step."""
        r = Running(turn, decoder)
        with self._cond:
            self._joining.append(r)
        return r

    def leave(self, r: Running) -> None:
        """Take `r` out; once this returns no step touches its decoder or sequence."""
        with self._cond:
            r.left = True
            if r in self._joining:
                self._joining.remove(r)
            while r in self._in_flight:
                self._cond.wait()

    def tokens(self, r: Running) -> Iterator[int]:
        """`r`'s tokens as steps choose them, until its turn finishes (raises the step's error
        for it, if any). Runs the next step on this thread when none is ready and no other
        thread is running one."""
        while True:
            lead = False
            with self._cond:
                while not r.out and not r.finished:
                    if not self._stepping:
                        self._stepping = lead = True
                        break
                    self._cond.wait()
                ready = list(r.out)
                r.out.clear()
                finished = r.finished
            if lead:
                try:
                    self.step()
                finally:
                    with self._cond:
                        self._stepping = False
                        self._cond.notify_all()
                continue
            yield from ready
            if finished:
                if r.error is not None:
                    raise r.error
                return

    def step(self) -> int:
        """Advance every running turn by one token; returns how many took part."""
        with self._lock, torch.inference_mode():
            with self._cond:
                self._active = [r for r in self._active + self._joining if not r.left]
                self._joining = []
                batch = self._in_flight = list(self._active)
                self._steps += 1
                self._peak = max(self._peak, len(batch))
            try:
                self._choose(batch)
                self._feed([r for r in batch if not r.finished])
            except BaseException as e:  # a fault of the step, not of one turn: each turn gets it
                for r in batch:
                    if not r.finished:
                        r.finished, r.error = True, e
                raise
            finally:
                with self._cond:
                    self._active = [r for r in self._active if not r.finished]
                    self._in_flight = []
                    self._cond.notify_all()
        return len(batch)

    def _choose(self, batch: list[Running]) -> None:
        """Each turn's next token, handed to its thread before the forward runs."""
        with self._cond:
            for r in batch:
                token = r.turn.choose()
                if token is not None:
                    r.out.append(token)
                r.finished = r.turn.finish is not None
            self._cond.notify_all()

    def _feed(self, batch: list[Running]) -> None:
        dense: list[Running] = []
        for r in batch:
            d = r.decoder
            if self._batchable and isinstance(d, DenseDecoder):
                if d.seq.num_tokens >= d.capacity:  # as DenseDecoder.feed: it holds no more
                    r.turn.fed(None)
                    continue
                dense.append(r)
            else:
                r.turn.fed(d.feed(*r.turn.feed()))
                self._solo += 1
        if len(dense) == 1:  # nothing to batch with: the one-sequence step, as without batching
            self._feed_one(dense[0])
        elif dense:
            self._feed_batch(dense)
        for r in batch:  # a decoder that holds no more, or the model's last position
            r.finished = r.turn.finish is not None

    def _feed_one(self, r: Running) -> None:
        feed = r.turn.feed()
        seq = r.decoder.seq  # type: ignore[attr-defined]
        try:
            logits = dense_step(self.forward, seq, feed.token, feed.position)
        except OutOfPagesError as e:  # this turn's fault alone (past its reserved pages)
            r.error = e
            r.turn.finish = "length"
            return
        r.turn.fed(logits)
        self._lone += 1

    def _feed_batch(self, dense: list[Running]) -> None:
        fed: list[Running] = []
        slots: list[Tensor] = []
        for r in dense:
            try:
                slots.append(r.decoder.seq.extend(1))  # type: ignore[attr-defined]
            except OutOfPagesError as e:  # this turn's fault alone (past its reserved pages)
                r.error = e
                r.turn.finish = "length"
                continue
            fed.append(r)
        if not fed:
            return
        feeds = [r.turn.feed() for r in fed]
        seqs = [r.decoder.seq for r in fed]  # type: ignore[attr-defined]
        tokens = [f.token for f in feeds]
        positions = [f.position for f in feeds]
        logits = batched_dense_step(self.forward, seqs, torch.cat(slots), tokens, positions)
        for r, row in zip(fed, logits, strict=True):
            r.turn.fed(row)
        self._rows += len(fed)
