"""Continuous batching of decoding turns: one step advances every running turn by a token (a
verified decoding round's pass by the tokens it verified).

    thread A  generate: [admit] [prefill+commit] first token, join -> tokens ... leave
    thread B  generate:      [admit]   wait   [prefill+commit] join -> tokens ... leave
    step k    choose a token for each turn (its own sampling, stops, max_new_tokens)
              -> finished turns leave -> feed the others as one batch
              (`batch_step.batched_step`): dense turns, and turns whose decoder begins a
              step row (`Decoder.begin_step`: the sparse ones, and verified decoding's
              drafts, a row per step, then its dense pass, a row of several tokens, whose
              step feeds the turn every token the pass verified, those beyond the first
              answered with no model work, `solo_feeds`; a pass that would take the step
              into one more matrix-product call waits a step, once, `_defer`); a turn alone
              in its step
              takes the one-sequence step (dense: `batch_step.one_step`, the engine's step
              without batching; sparse: its decoder's own), so a lone request decodes at
              its speed
    step k+1  turns that joined since step k take part; turns cancelled since leave

There is no scheduler thread: a turn's thread that finds no token ready runs the next step
itself unless another thread is running one, and waits otherwise. Each step, like each prefill,
holds the engine's lock; a step asks it `first()` (`runtime/sharing.py`), so while prefills
wait, steps and bursts of prefills alternate: after a step, prefills run back to back while
their tokens fit `EngineConfig.prefill_burst_tokens`, at least one, then the next step (a
prefill runs as its own unit before its turn joins the batch). A turn's first token comes
from its prefill's logits and reaches its caller before the turn asks the lock again (its
decoder's set-up).

Chunked prefill (`EngineConfig.prefill_chunk_tokens`, `runtime/chunked.py`): a long prefill
whose plan the runtime runs in chunks is handed to the scheduler instead (`prefill`), and each
step runs chunks of the waiting prefills, oldest first, up to the step's token budget (at
least one chunk), after choosing the decoding turns' tokens:

    step k     decode: every running turn + 1 token    prefill: A's chunk 3
    step k+1   decode: every running turn + 1 token    prefill: A's last chunk -> A joins
    step k+2   decode: ... A too                       prefill: B's chunk 0

Fused: each waiting prefill's first chunk of the step, when its plan fuses
(`ChunkedPrefill.fusable`: its computed tokens are the prompt's last ones), runs inside the
turns' batch (`batch_step.batched_step`: one pass through the projections and MLPs,
attention per sequence); its further chunks in the step, the chunks of other plans, and every
chunk of a step with no turn to feed in a batch run on their own after it
(`separate_chunks`). A fusable plan's chunk gets the same bits either way
(`ChunkedPrefill.run_chunk`), so what a step fuses changes no turn's bits. A turn alone in
its step with a chunk to fuse is fed in the padded batch, not by the one-sequence step. A
fault of the fused forward is the step's.

A prefill's thread waits for its result as a turn's waits for tokens (running steps itself
when none is running); set, its `cancel` stops it before its next chunk (`TurnCancelled`).

Alone and batched, a row's logits agree to fp32 rounding (a one-row matmul sums in another
order than the padded batch's, `batch_step`), not bit for bit: a turn that decodes partly
alone and partly in a batch gets the greedy ids it gets alone unless two logits tie to that
rounding (`tests/runtime/test_scheduler.py`, `benchmarks/batch_decode.py` compare them); a
sparse turn likewise, and its page selection unless two pages' score bounds (from its q) tie
to that rounding (`tests/runtime/test_scheduler_sparse.py`).

Preemption (`EngineConfig.preemption`; `kv/preemption.py`): when the pool cannot give the
step's dense turns their next slots, the newest running dense turn is preempted (its KV
swapped to host memory, or dropped) until the rest fit (a sparse turn's KV is its decoder's,
not the pool's); it waits, its token chosen and not yet fed, and is resumed at the start of a
later step, oldest first, once its pages are free beside what the running turns need. A
dropped turn is recomputed: its prompt by its own prefill (`refill`), its generated tokens
replayed one by one through the step each was first fed by (alone or in a padded batch), so
its KV is what it computed before. Turns wait at admission while any is preempted
(`PageGate.hold`), so a preempted turn is not starved by new ones.

A step never calls back into the caller: chosen tokens go to each turn's `out`, and the
turn's own thread hands them to its `on_token` (which may raise: the turn then leaves).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentcache.decode.base import Decoder, StepRow, row_logits
from agentcache.decode.dense import DenseDecoder, reads_in_place
from agentcache.errors import AgentCacheError, OutOfPagesError
from agentcache.kv.pool import SequenceKV
from agentcache.kv.preemption import Preempted, PreemptionPolicy
from agentcache.model.llama import LlamaForward
from agentcache.reuse.base import PrefillResult
from agentcache.runtime.batch_step import (
    DenseRow,
    StepTimes,
    batched_dense_step,
    batched_step,
    call_rule,
    one_step,
)
from agentcache.runtime.chunked import ChunkedPrefill
from agentcache.runtime.loop import TurnDecoding
from agentcache.runtime.sharing import FairLock

IDLE_WAIT_S = 0.005  # a step that advanced no turn (all preempted, none fits): wait this long


@dataclass(eq=False)
class Running:
    """One turn in the batch: its decode state and decoder, and what its thread has not read."""

    turn: TurnDecoding
    decoder: Decoder
    out: deque[int] = field(default_factory=deque)
    finished: bool = False  # set by a step: `turn.finish` is final, or `error` is set
    error: BaseException | None = None
    left: bool = False  # set by the turn's thread: no step may touch it any more
    # preemption: `refill` prefills the prompt into an empty sequence again (None: the turn
    # cannot be preempted); `order` is when it joined; `batched[i]` whether generated token i
    # was fed in a batch (else alone); `first_position` is generated token 0's
    refill: Callable[[SequenceKV], None] | None = None
    order: int = 0
    first_position: int = 0
    prompt_tokens: int = 0
    batched: list[bool] = field(default_factory=list)
    preempted: Preempted | None = None  # its KV out of the pool
    unfed: bool = False  # its token is chosen (joined so, or preempted then): fed next
    # its decoder's next row, begun by the last step's `StepRow.take` (a verified decoder's
    # next draft): the turn was fed nothing, and this row runs in the next step
    row: StepRow | None = None
    deferred: bool = False  # its row of several tokens waited a step for room (`_defer`)


class TurnCancelled(AgentCacheError):
    """The turn's `cancel` was set while its prefill ran in chunks: it stopped before its next
    chunk."""


@dataclass(eq=False)
class Prefilling:
    """One chunked prefill waiting in the scheduler: its work, and what its thread reads."""

    work: ChunkedPrefill
    cancel: threading.Event | None = None
    result: PrefillResult | None = None
    error: BaseException | None = None
    left: bool = False  # set by its thread: no step may touch it any more

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass(frozen=True)
class BatchStats:
    steps: int  # scheduler steps run
    batched_rows: int  # tokens fed through batched steps
    solo_feeds: int  # tokens fed by the decoder's own `feed` (no `begin_step` row: a dense
    # decoder whose forward is not read in place; verified decoding answering from tokens it
    # verified already, no model work, in the step of the pass that verified them)
    peak_batch: int  # most turns in one step
    lone_steps: int = 0  # tokens of a turn alone in its step (the one-sequence step)
    preempted: int = 0  # turns preempted (a turn may be preempted more than once)
    resumed: int = 0  # preempted turns resumed
    swapped_bytes: int = 0  # K/V bytes copied to the host by preemptions
    recomputed_tokens: int = 0  # tokens recomputed on resume (prompt and generated)
    waiting_preempted: int = 0  # turns preempted and not yet resumed, now
    prefill_chunks: int = 0  # chunks of chunked prefills run by steps
    mixed_steps: int = 0  # steps that ran a prefill chunk and advanced a decoding turn
    fused_chunks: int = 0  # chunks run inside a step's decode batch (`batch_step.fused_step`)
    separate_chunks: int = 0  # chunks run as their own forward (nothing to fuse with, or a
    # plan whose chunks do not fuse: `ChunkedPrefill.fusable`)
    batched_sparse_feeds: int = 0  # of batched_rows, a sparse decoder's (`Decoder.begin_step`;
    # a verified decoder's drafts and dense passes included, a pass of n tokens as one row)
    deferred_rows: int = 0  # rows of several tokens that waited a step (`BatchScheduler._defer`)
    # seconds of model work in steps, by part: batched steps' (`batch_step.StepTimes`:
    # `attention:<row kind>`, `chunks`, `rest`) and `alone`, a turn's step on its own (the
    # one-sequence step, a row alone, a decoder's own feed)
    step_seconds: dict[str, float] = field(default_factory=dict)


class BatchScheduler:
    """Owns the running turns of one engine. Thread-safe: `join`, `tokens` and `leave` are
    called from each turn's thread; `step` holds the engine's `lock`. With `preemption`, a
    full pool preempts turns instead of failing them; `wake` is called (outside the engine
    lock) after a step resumed turns, for whoever waits on `waiting_preempted` to clear."""

    def __init__(
        self,
        forward: LlamaForward,
        lock: FairLock,
        preemption: PreemptionPolicy | None = None,
        wake: Callable[[], None] | None = None,
        prefill_tokens: int = 0,
    ) -> None:
        """`prefill_tokens`: the tokens of chunked prefills a step computes (at least one
        chunk); prefills are handed over by `prefill`."""
        self.forward, self._lock = forward, lock
        self.prefill_tokens = prefill_tokens
        self.preemption, self._wake = preemption, wake
        self._batchable = reads_in_place(forward)
        self._cond = threading.Condition(threading.Lock())
        self._joining: list[Running] = []
        self._active: list[Running] = []
        self._in_flight: list[Running] = []
        self._stepping = False
        self._prefills: list[Prefilling] = []
        self._prefills_in_flight: list[Prefilling] = []
        self._chunks = self._mixed = self._fused = 0
        self._steps = self._rows = self._solo = self._peak = self._lone = 0
        self._joined = self._resumed = self._recomputed = self._sparse_rows = self._deferred = 0
        self._times, self._alone = StepTimes(), 0.0  # seconds of steps' model work
        self.waiting_preempted = 0  # read without a lock by `PageGate.hold`

    def stats(self) -> BatchStats:
        with self._cond:
            c = self.preemption.counters if self.preemption is not None else None
            return BatchStats(
                self._steps, self._rows, self._solo, self._peak, self._lone,
                c.preempted if c else 0, self._resumed, c.swapped_bytes if c else 0,
                self._recomputed, self.waiting_preempted, self._chunks, self._mixed,
                self._fused, self._chunks - self._fused, self._sparse_rows, self._deferred,
                {**self._times.seconds(), "alone": self._alone},
            )  # fmt: skip

    @property
    def running(self) -> int:
        with self._cond:
            return len(self._active) + len(self._joining)

    def join(
        self, turn: TurnDecoding, decoder: Decoder,
        refill: Callable[[SequenceKV], None] | None = None, chosen: bool = False,
    ) -> Running:  # fmt: skip
        """Add a prefilled turn; it takes part from the next step. `refill` prefills its
        prompt into an empty sequence again (needed to preempt it by dropping its KV);
        `chosen`: its thread chose its first token already (the step feeds it first)."""
        r = Running(turn, decoder, refill=refill, first_position=turn.position, unfed=chosen)
        if isinstance(decoder, DenseDecoder):
            r.prompt_tokens = decoder.seq.num_tokens
        with self._cond:
            self._joined += 1
            r.order = self._joined
            self._joining.append(r)
        return r

    def leave(self, r: Running) -> None:
        """Take `r` out; once this returns no step touches its decoder or sequence (a
        preempted turn's host copy is let go)."""
        with self._cond:
            r.left = True
            if r in self._joining:
                self._joining.remove(r)
            while r in self._in_flight:
                self._cond.wait()
            if r.preempted is not None:
                if self.preemption is not None:
                    self.preemption.discard(r.preempted)
                r.preempted = None
                self.waiting_preempted -= 1
                woke = True
            else:
                woke = False
        if woke and self._wake is not None:
            self._wake()

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
                advanced = 0
                try:
                    advanced = self.step()
                finally:
                    with self._cond:
                        self._stepping = False
                        self._cond.notify_all()
                        if not advanced and not r.out and not r.finished:
                            self._cond.wait(IDLE_WAIT_S)  # all preempted: pages come back
                continue
            yield from ready
            if finished:
                if r.error is not None:
                    raise r.error
                return

    def step(self) -> int:
        """Advance every running turn by one token (or a verified round's tokens, `_drain`);
        returns how many took part (a preempted turn that is not resumed does not)."""
        resumed = 0
        ready: list[Running] = []
        # one step serves every running turn: ahead of the waiting prefills, once in turn
        with self._lock.first(), torch.inference_mode():
            with self._cond:
                self._active = [r for r in self._active + self._joining if not r.left]
                self._joining = []
                batch = self._in_flight = list(self._active)
                jobs = self._prefills_in_flight = [j for j in self._prefills if not j.left]
                self._steps += 1
            chunks = fused = 0
            try:
                resumed = self._resume(batch)
                ready = [r for r in batch if r.preempted is None]
                with self._cond:
                    self._peak = max(self._peak, len(ready))
                self._choose([r for r in ready if not r.unfed and r.row is None])
                for r in ready:
                    r.unfed = False
                picked = self._pick_chunks(jobs)
                fusing = [j for j in dict.fromkeys(picked) if self._fuses(j)]
                done = self._feed([r for r in ready if not r.finished], fusing)
                fused = len(done)
                rest = list(picked)
                for j in done:  # its first chunk of the step ran in the batch
                    rest.remove(j)
                chunks = fused + sum(self._run_chunk(j) for j in rest)
            except BaseException as e:  # a fault of the step, not of one turn: each turn gets it
                for r in batch:
                    if not r.finished:
                        r.finished, r.error = True, e
                for j in jobs:
                    if not j.finished:
                        j.error = e
                raise
            finally:
                with self._cond:
                    self._active = [r for r in self._active if not r.finished]
                    self._in_flight, self._prefills_in_flight = [], []
                    self._prefills = [j for j in self._prefills if not j.finished]
                    self._chunks += chunks
                    self._fused += fused
                    self._mixed += int(chunks > 0 and len(ready) > 0)
                    self._cond.notify_all()
        if resumed and self._wake is not None:
            self._wake()
        return len(ready) + chunks

    def prefill(self, work: ChunkedPrefill, cancel: threading.Event | None = None) -> PrefillResult:
        """Run `work` in the steps, chunk by chunk beside the decoding turns; its result. Runs
        steps on this thread when no other thread is running one. Raises its chunk's error,
        or `TurnCancelled` once `cancel` is set (no chunk runs after); once it returns or
        raises, no step touches `work`'s sequence."""
        job = Prefilling(work, cancel)
        with self._cond:
            self._prefills.append(job)
        try:
            while True:
                lead = False
                with self._cond:
                    while not job.finished:
                        if not self._stepping:
                            self._stepping = lead = True
                            break
                        self._cond.wait()
                    if not lead:
                        break
                try:
                    self.step()
                finally:
                    with self._cond:
                        self._stepping = False
                        self._cond.notify_all()
        finally:
            with self._cond:
                job.left = True
                while job in self._prefills_in_flight:
                    self._cond.wait()
                if job in self._prefills:
                    self._prefills.remove(job)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _pick_chunks(self, jobs: list[Prefilling]) -> list[Prefilling]:
        """The step's chunks, a job once per chunk: of `jobs`, oldest first, while the step's
        token budget lasts (at least one chunk). A job cancelled now runs none (its error is
        set); `_run_chunk` looks again before each chunk it runs."""
        picked: list[Prefilling] = []
        tokens = 0
        for j in jobs:
            if j.finished:
                continue
            if j.cancel is not None and j.cancel.is_set():
                j.error = TurnCancelled("cancelled before its prefill finished")
                continue
            left = len(j.work.computed) - j.work.done
            while left > 0:
                n = min(j.work.chunk, left)
                if picked and tokens + n > self.prefill_tokens:
                    return picked
                picked.append(j)
                tokens, left = tokens + n, left - n
        return picked

    def _fuses(self, j: Prefilling) -> bool:
        """Whether `j`'s next chunk may run inside the step's decode batch: its plan's chunks
        fuse (`ChunkedPrefill.fusable`) and it computes with the scheduler's forward, whose
        attention is the plain one the fused step reads in place."""
        w = j.work
        return self._batchable and w.fusable and w.ctx.model.forward is self.forward

    def _run_chunk(self, j: Prefilling) -> int:
        """`j`'s next chunk as its own forward, unless it finished or is cancelled (looked at
        once per chunk); 1 if it ran. A chunk's error is its job's alone."""
        if j.finished:
            return 0
        if j.cancel is not None and j.cancel.is_set():
            j.error = TurnCancelled("cancelled before its prefill finished")
            return 0
        try:
            j.result = j.work.run_chunk()
        except Exception as e:  # this prefill's fault alone
            j.error = e
        return 1

    def _choose(self, batch: list[Running]) -> None:
        """Each turn's next token, handed to its thread before the forward runs."""
        with self._cond:
            for r in batch:
                self._hand(r)
                r.finished = r.turn.finish is not None
            self._cond.notify_all()

    @staticmethod
    def _hand(r: Running) -> None:
        """Choose the turn's next token and hand it to the turn's thread (`out`); under the
        scheduler's condition, whose waiters the caller notifies."""
        token = r.turn.choose()
        if token is not None:
            r.out.append(token)

    def _feed(self, batch: list[Running], fusing: list[Prefilling]) -> list[Prefilling]:
        """Feed every turn of `batch` its token; `fusing`: jobs whose next chunk may run in
        the turns' batch (`_feed_batch`). Returns those whose chunk ran there (none without a
        turn to feed in a batch)."""
        dense: list[Running] = []
        rows: list[tuple[Running, StepRow]] = []  # begun: a batchable decoder's rows
        fused: list[Prefilling] = []
        for r in batch:
            d = r.decoder
            if r.row is not None:  # its decoder's next row, begun by the last step
                rows.append((r, r.row))
                r.row = None
                continue
            if self._batchable and isinstance(d, DenseDecoder):
                if d.seq.num_tokens >= d.capacity:  # as DenseDecoder.feed: it holds no more
                    r.turn.fed(None)
                    continue
                dense.append(r)
                continue
            feed = r.turn.feed()
            try:
                row = d.begin_step(self.forward, feed.token, feed.position, feed.room)
                if row is not None:
                    rows.append((r, row))
                    continue
                self._solo += 1
                with self._timed_alone():
                    logits = d.feed(*feed)
                r.turn.fed(logits)
            except OutOfPagesError as e:  # this turn's fault alone
                r.error = e
                r.turn.finish = "length"
        rows = self._defer(len(dense), rows)
        if self.preemption is not None:
            dense = self._make_room(dense)
        if len(dense) + len(rows) == 1 and not fusing:  # nothing to batch with: alone
            if dense:
                self._feed_one(dense[0])
            else:
                self._feed_row(*rows[0])
        elif dense or rows:
            fused = self._feed_batch(dense, rows, fusing)
        self._drain(batch)
        for r in batch:  # a decoder that holds no more, or the model's last position
            r.finished = r.turn.finish is not None
        return fused

    def _defer(
        self, dense: int, rows: list[tuple[Running, StepRow]]
    ) -> list[tuple[Running, StepRow]]:
        """The begun `rows` this step runs beside `dense` dense turns: a row of several tokens
        (a verified round's dense pass) that would take the step's decode rows into one more
        matrix-product call (`batch_step.call_rule`: on a CPU whose calls are of a fixed size,
        a call's cost whatever fills it) waits for the next step, once; a row that waited runs
        whatever it costs. Where it runs changes none of its bits (row invariance)."""
        if all(row.width == 1 for _, row in rows):
            return rows
        calls = call_rule(self.forward).calls
        n = dense + sum(row.width for r, row in rows if row.width == 1 or r.deferred)
        run: list[tuple[Running, StepRow]] = []
        for r, row in rows:
            if row.width > 1 and not r.deferred:
                if len(calls(n + row.width)) > len(calls(n)):
                    r.row, r.deferred = row, True
                    self._deferred += 1
                    continue
                n += row.width
            r.deferred = False
            run.append((r, row))
        return run

    def _drain(self, batch: list[Running]) -> None:
        """Turns whose decoder answers its next feeds with no model work (`Decoder.queued`: a
        verified round's tokens) take them in this step: each chosen and handed to its thread
        (`_hand`, as `_choose` does) and fed, until the decoder needs the model again or the
        turn ends. The last answer's token is chosen by the next step, which feeds it to the
        model."""
        with self._cond:
            for r in batch:
                d = r.decoder
                while r.turn.finish is None and r.row is None and d.queued():
                    self._hand(r)
                    if r.turn.finish is not None:
                        break
                    r.turn.fed(d.feed(*r.turn.feed()))
                    self._solo += 1
            self._cond.notify_all()

    def _make_room(self, dense: list[Running]) -> list[Running]:
        """Preempt the newest of `dense` until the others' next slots fit the pool; the turns
        left to feed. The last one is preempted too when turns outside the step hold pages (a
        turn between its prefill and its first step, one that left and has not yet given its
        pages back: each gives them back soon, and the engine's admission check lets a turn
        alone fit the pool); it resumes once they do. Else it is kept: alone and short of
        pages, it fails as before."""
        assert self.preemption is not None
        dense = list(dense)
        while dense:
            pool = _seq(dense[0]).pool
            need = sum(_seq(r).table.pages_needed(_seq(r).num_tokens + 1) for r in dense)
            if need <= pool.num_free:
                break
            victims = [r for r in dense if r.refill is not None]
            if not victims:
                break
            if len(dense) == 1 and pool.num_used <= len(_seq(dense[0]).table.pages):
                break  # it holds every page in use: nothing comes back by waiting
            victim = max(victims, key=lambda r: r.order)
            dense.remove(victim)
            self._preempt(victim)
        return dense

    def _preempt(self, r: Running) -> None:
        assert self.preemption is not None
        r.preempted = self.preemption.preempt(_seq(r))
        r.unfed = True  # its token is chosen: fed, not chosen, once resumed
        with self._cond:
            self.waiting_preempted += 1

    def _resume(self, batch: list[Running]) -> int:
        """Resume preempted turns of `batch`, oldest first, while each fits beside the next
        slots of the running ones; stops at the first that does not. Returns how many."""
        waiting = sorted((r for r in batch if r.preempted is not None), key=lambda r: r.order)
        if not waiting or self.preemption is None:
            return 0
        running = [r for r in batch if r.preempted is None and isinstance(r.decoder, DenseDecoder)]
        need = sum(_seq(r).table.pages_needed(_seq(r).num_tokens + 1) for r in running)
        done = 0
        for r in waiting:
            seq, p = _seq(r), r.preempted
            assert p is not None
            pages = -(-(p.num_tokens + 1) // seq.pool.config.page_size)
            if need + pages > seq.pool.num_free:
                break
            seq.reserve(pages)  # one run of slots where the pool has one
            restored = self.preemption.resume(seq, p)
            if restored < p.num_tokens:
                self._recompute(r, seq)
                self._recomputed += p.num_tokens - restored
            if seq.num_tokens != p.num_tokens:  # never resume a turn on other KV than its own
                raise RuntimeError(f"resumed a turn with {seq.num_tokens} tokens of KV, it "
                                   f"held {p.num_tokens} when preempted")  # fmt: skip
            r.preempted = None
            need += pages
            done += 1
            with self._cond:
                self.waiting_preempted -= 1
                self._resumed += 1
        return done

    def _recompute(self, r: Running, seq: SequenceKV) -> None:
        """`r`'s KV computed again into the empty `seq`: the prompt by its own prefill, each
        generated token fed as it first was (alone, or in a padded batch: the same bits)."""
        assert r.refill is not None
        r.refill(seq)
        if seq.num_tokens != r.prompt_tokens:
            raise RuntimeError(f"recomputing a preempted turn's prompt gave {seq.num_tokens} "
                               f"tokens of KV, it had {r.prompt_tokens}")  # fmt: skip
        f = self.forward
        for i, batched in enumerate(r.batched):
            token, position = r.turn.ids[i], r.first_position + i
            if batched:
                batched_dense_step(f, [seq], seq.extend(1), [token], [position])
            else:
                one_step(f, seq, token, position)

    def _feed_one(self, r: Running) -> None:
        feed = r.turn.feed()
        try:
            with self._timed_alone():
                logits = one_step(self.forward, _seq(r), feed.token, feed.position)
        except OutOfPagesError as e:  # this turn's fault alone (past its reserved pages)
            r.error = e
            r.turn.finish = "length"
            return
        r.turn.fed(logits)
        r.batched.append(False)
        self._lone += 1

    def _feed_row(self, r: Running, row: StepRow) -> None:
        """A begun row alone: its decoder's own step (`decode.base.row_logits`)."""
        with self._timed_alone():
            logits = row_logits(self.forward, row)
        self._take(r, row, logits, batched=False)
        self._lone += 1

    @contextmanager
    def _timed_alone(self) -> Iterator[None]:
        """Adds the block's seconds to `step_seconds["alone"]`, however it ends (one step runs
        at a time: no other thread adds to it meanwhile)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._alone += time.perf_counter() - t0

    def _take(self, r: Running, row: StepRow, logits: Tensor, batched: bool) -> None:
        """`row`'s logits after its step (n, V), to its decoder (`StepRow.take`): the turn is
        fed the answer, or nothing when the decoder began its next row (run in the next
        step)."""
        try:
            after = row.take(logits)
        except OutOfPagesError as e:  # this turn's fault alone (its next row's slot)
            r.error = e
            r.turn.finish = "length"
            return
        if isinstance(after, StepRow):
            r.row = after
            return
        r.turn.fed(after)
        r.batched.append(batched)

    def _feed_batch(
        self, dense: list[Running], begun: list[tuple[Running, StepRow]],
        fusing: list[Prefilling],
    ) -> list[Prefilling]:  # fmt: skip
        """The dense turns' tokens and the `begun` rows as one padded batch, with the next
        chunk of each job of `fusing` in it (`batch_step.batched_step`); the jobs whose chunk
        ran (none when no turn could take part). A fault of the fused forward is the step's."""
        fed: list[Running] = []
        slots: list[Tensor] = []
        for r in dense:
            try:
                slots.append(_seq(r).extend(1))
            except OutOfPagesError as e:  # this turn's fault alone (past its reserved pages)
                r.error = e
                r.turn.finish = "length"
                continue
            fed.append(r)
        if not fed and not begun:
            return []
        rows: list[StepRow] = []
        for r, slot in zip(fed, slots, strict=True):
            feed = r.turn.feed()
            rows.append(DenseRow(self.forward, _seq(r), slot, feed.token, feed.position))
        rows += [row for _, row in begun]
        chunks = [j.work.next_rows() for j in fusing]
        t0 = time.perf_counter()
        times = StepTimes()
        logits, last = batched_step(self.forward, rows, chunks, times)
        with self._cond:
            self._times.add(times)
        seconds = time.perf_counter() - t0
        start = 0
        for r, row in zip([*fed, *(r for r, _ in begun)], rows, strict=True):
            end = start + row.width
            self._take(r, row, logits[start:end], batched=True)  # the bits of a padded batch
            start = end
        for j, chunk_logits in zip(fusing, last, strict=True):
            try:
                j.result = j.work.take_fused(chunk_logits, seconds)
            except Exception as e:  # its plan's bookkeeping (`finish`): this prefill's alone
                j.error = e
        self._rows += len(rows)
        self._sparse_rows += len(begun)
        return fusing


def _seq(r: Running) -> SequenceKV:
    """A dense turn's sequence."""
    assert isinstance(r.decoder, DenseDecoder)
    return r.decoder.seq
