"""Continuous batching: many turns at once, each with the output it gets alone; turns join at
the next step and leave at the next step (finished or cancelled), their pages freed."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest
import torch

from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.runtime.loop import TurnDecoding
from tests.conftest import at_once

KV_PAGES = 256


class Gone(Exception):
    """What a caller's `on_token` raises when its client left."""


def prompt(i: int) -> SegmentedPrompt:
    """Conversation i's prompt, its length growing with i."""
    return SegmentedPrompt([
        Segment(SegmentKind.SYSTEM, f"You are agent {i}. Answer briefly. " * (1 + i % 3), "sys",
                "system"),
        Segment(SegmentKind.UPDATE, f"list the files of project {i}" + "!" * (5 * i), "new",
                "user"),
    ])  # fmt: skip


# (strategy, params) per request: lengths, sampling, seeds and stop strings all differ
REQUESTS = [
    ("full", GenerationParams(max_new_tokens=3)),
    ("prefix", GenerationParams(max_new_tokens=17)),
    ("full", GenerationParams(max_new_tokens=30, stop=("e", "\n"))),
    ("rpdc", GenerationParams(max_new_tokens=9)),
    ("full", GenerationParams(max_new_tokens=25, temperature=0.8, seed=7)),
    ("prefix", GenerationParams(max_new_tokens=1)),
    ("full", GenerationParams(max_new_tokens=12, temperature=1.2, top_p=0.9, seed=3)),
    ("full", GenerationParams(max_new_tokens=40, stop=("zz", "q"))),
]


def engine(model: LoadedModel, batch: bool = True, burst: int = 0) -> Engine:
    config = EngineConfig(kv_pages=KV_PAGES, batch_decode=batch, prefill_burst_tokens=burst)
    return Engine(model, config)


def one(e: Engine, i: int, on_token: Callable[[int], None] | None = None) -> Generation:
    strategy, params = REQUESTS[i]
    return e.generate(prompt(i), params, strategy, commit=False, on_token=on_token)


@pytest.mark.parametrize("burst", [0, 4096])
def test_every_turn_of_a_batch_gets_its_output_alone(tiny: LoadedModel, burst: int) -> None:
    """Eight turns at once (different lengths, strategies, sampling, stop strings) give the ids
    each gets alone on the batched engine, bit for bit, and greedy ones those of the
    one-sequence step; the steps did batch them; with prefills run in bursts between steps
    too."""
    e = engine(tiny, burst=burst)
    assert e._lock.burst_tokens == burst
    alone = [one(e, i) for i in range(len(REQUESTS))]
    steps_alone = e.batch.stats().steps if e.batch else 0
    together = at_once(lambda i: one(e, i), len(REQUESTS))
    for a, t in zip(alone, together, strict=True):
        assert t.token_ids == a.token_ids
        assert t.finish_reason == a.finish_reason
        assert t.text == a.text
    stats = e.batch.stats() if e.batch else None
    assert stats is not None and stats.peak_batch >= 2
    assert stats.steps - steps_alone < sum(len(a.token_ids) for a in alone)  # shared steps
    assert stats.solo_feeds == 0
    ref = engine(tiny, batch=False)
    for i, a in enumerate(alone):
        if REQUESTS[i][1].temperature == 0:
            assert one(ref, i).token_ids == a.token_ids
    assert e.ctx.pool.num_free == KV_PAGES


def test_a_stop_string_ends_a_batched_turn_where_it_ends_the_reference(tiny: LoadedModel) -> None:
    e, ref = engine(tiny), engine(tiny, batch=False)
    free = ref.generate(prompt(2), GenerationParams(max_new_tokens=30), "full", commit=False)
    stop = free.text[6:8]  # a string the reply holds: it stops there
    assert len(stop) == 2
    params = GenerationParams(max_new_tokens=30, stop=(stop,))
    want = ref.generate(prompt(2), params, "full", commit=False)
    got = at_once(lambda i: e.generate(prompt(2 + 3 * i), params, "full", commit=False), 2)[0]
    assert (got.token_ids, got.finish_reason, got.text) == (
        want.token_ids, want.finish_reason, want.text)  # fmt: skip
    assert want.finish_reason == "stop" and len(want.token_ids) < len(free.token_ids)


def test_a_cancelled_turn_leaves_and_the_others_finish_as_alone(tiny: LoadedModel) -> None:
    e = engine(tiny)
    long_alone = one(e, 7)
    seen: list[int] = []

    def cancel_at_third(token: int) -> None:
        seen.append(token)
        if len(seen) == 3:
            raise Gone("client gone")

    def cancelled() -> str:
        with pytest.raises(Gone):
            one(e, 1, on_token=cancel_at_third)
        return "cancelled"

    out = at_once(lambda i: cancelled() if i == 0 else one(e, 7), 2)
    assert out[0] == "cancelled" and len(seen) == 3
    assert isinstance(out[1], Generation) and out[1].token_ids == long_alone.token_ids
    assert e.ctx.pool.num_free == KV_PAGES  # the cancelled turn's pages are back
    assert e.batch is not None and e.batch.running == 0


def test_a_turn_joins_at_the_next_step(tiny: LoadedModel) -> None:
    """Driven step by step from one thread: a turn joined between steps k and k+1 takes its
    first token at step k+1, and one that leaves is not stepped again."""
    e = engine(tiny)
    assert e.batch is not None
    seqs, turns = [], []
    for i in (0, 3):
        seq, pre = e.prefill(e.tokenize(prompt(i)), "full")
        seqs.append(seq)
        params = GenerationParams(max_new_tokens=10)
        turns.append(TurnDecoding(pre.logits, seq.num_tokens, params, 4096, tiny.tokenizer))
    from agentcache.decode.dense import DenseDecoder

    a = e.batch.join(turns[0], DenseDecoder(e.step, seqs[0], KV_PAGES * 16))
    assert e.batch.step() == 1 and len(turns[0].ids) == 1
    b = e.batch.join(turns[1], DenseDecoder(e.step, seqs[1], KV_PAGES * 16))
    assert e.batch.step() == 2 and (len(turns[0].ids), len(turns[1].ids)) == (2, 1)
    e.batch.leave(a)
    assert e.batch.step() == 1 and (len(turns[0].ids), len(turns[1].ids)) == (2, 2)
    assert list(b.out) == turns[1].ids
    e.batch.leave(b)
    assert e.batch.step() == 0
    for s in seqs:
        s.free()


def test_a_turn_alone_decodes_on_its_own_thread(tiny: LoadedModel) -> None:
    """No scheduler thread: a lone turn's thread runs its steps itself."""
    e = engine(tiny)
    threads: set[int] = set()
    gen = one(e, 1, on_token=lambda _: threads.add(threading.get_ident()))
    assert threads == {threading.get_ident()}
    assert e.batch is not None and e.batch.stats().steps == len(gen.token_ids)


def test_a_step_fault_reaches_the_turns_in_it(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(tiny)

    def broken(*_: object) -> torch.Tensor:
        raise RuntimeError("step failed")

    # every step the scheduler may take: together (the batched step, and the recompute of a
    # preempted turn's batched tokens) and alone (the one-sequence step)
    monkeypatch.setattr("agentcache.runtime.scheduler.batched_step", broken)
    monkeypatch.setattr("agentcache.runtime.scheduler.batched_dense_step", broken)
    monkeypatch.setattr("agentcache.runtime.scheduler.one_step", broken)
    with pytest.raises(RuntimeError, match="step failed"):
        one(e, 1)  # alone: the one-sequence step

    def caught(i: int) -> str:
        with pytest.raises(RuntimeError, match="step failed"):
            one(e, 7)
        return "raised"

    assert at_once(caught, 2) == ["raised", "raised"]  # together: the batched step
    assert e.ctx.pool.num_free == KV_PAGES and e.batch is not None and e.batch.running == 0


def test_a_lone_turn_takes_the_one_sequence_step(tiny: LoadedModel) -> None:
    """Alone, a turn decodes as the engine without batching does (same step, same ids); with
    company, its steps batch. Counted, not timed."""
    e, ref = engine(tiny), engine(tiny, batch=False)
    alone = one(e, 7)
    assert alone.token_ids == one(ref, 7).token_ids
    stats = e.batch.stats() if e.batch else None
    assert stats is not None and stats.batched_rows == 0
    assert stats.lone_steps == stats.steps - 1 == len(alone.token_ids) - 1  # last: no feed
    decoding = threading.Event()  # the first turn has its second token: it is in the batch
    joined = threading.Event()  # the second turn has its first token: it decodes from now on
    tokens = itertools.count(1)

    def on_token(_: int) -> None:
        n = next(tokens)
        if n == 2:
            decoding.set()
        elif n == 3:  # the first turn holds its third token until the second has joined, so
            joined.wait(timeout=60)  # their steps overlap however slow the second's prefill

    def turn(i: int) -> Generation:
        if i == 0:
            return one(e, 7, on_token=on_token)
        decoding.wait()
        return one(e, 7, on_token=lambda _: joined.set())

    assert len(alone.token_ids) > 8  # the second turn joins while the first decodes
    together = at_once(turn, 2)
    assert [t.token_ids for t in together] == [alone.token_ids] * 2
    assert e.batch is not None and e.batch.stats().batched_rows > 0


def test_the_first_token_is_handed_over_before_any_step(tiny: LoadedModel) -> None:
    """It comes from the prefill's logits: no step's forward stands between the prefill and
    the caller's first token (counted in steps, as the caller sees them)."""
    e = engine(tiny)
    assert e.batch is not None
    batch = e.batch
    steps_seen: list[int] = []
    gen = one(e, 7, on_token=lambda _: steps_seen.append(batch.stats().steps))
    assert steps_seen[0] == 0 and len(steps_seen) == len(gen.token_ids) > 2
    assert steps_seen[1:] == list(range(2, len(gen.token_ids) + 1))


def test_the_first_token_does_not_wait_for_the_engine_lock(tiny: LoadedModel) -> None:
    """A thread that queued for the engine during the turn's prefill (another request's
    prefill) holds it when the prefill ends: the turn's first token reaches its caller all
    the same, and the turn then decodes what it decodes alone."""
    e = engine(tiny)
    ref = one(engine(tiny), 7)
    holding, release, first = threading.Event(), threading.Event(), threading.Event()
    commit = e._commit

    def hold() -> None:
        with e._lock:
            holding.set()
            release.wait(60)

    def commit_then_queue(*args: object) -> None:
        commit(*args)  # type: ignore[arg-type]
        threading.Thread(target=hold, daemon=True).start()
        while e._lock.waiting == 0:  # it asks while the prefill holds the lock
            threading.Event().wait(0.001)

    e._commit = commit_then_queue  # type: ignore[method-assign]
    out: list[Generation] = []
    strategy, params = REQUESTS[7]

    def run() -> None:  # committed: the commit ends the prefill's hold of the lock
        out.append(e.generate(prompt(7), params, strategy, on_token=lambda _: first.set()))

    turn = threading.Thread(target=run)
    turn.start()
    try:
        assert holding.wait(30) and first.wait(30)  # the first token, the lock held elsewhere
        assert not release.is_set() and turn.is_alive()
    finally:
        release.set()
        turn.join(60)
    assert out[0].token_ids == ref.token_ids


def test_the_server_batches_unless_told_not_to() -> None:
    from agentcache.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["serve"]).batch_decode is True
    assert parse(["serve", "--no-batch-decode"]).batch_decode is False
