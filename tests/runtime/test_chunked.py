"""Chunked prefill in the batched scheduler: the chunks agree with the whole prefill, decoding
turns advance between a long prefill's chunks, a cancelled prefill frees its pages. Counted
in steps and chunks, never timed."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
import torch

from agentcache.errors import ConfigError
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime import chunked
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.runtime.scheduler import TurnCancelled
from agentcache.testing import tiny_family_model
from tests.conftest import at_once

KV_PAGES = 256
# fp32 over the tiny model's 4 layers: a chunk's rows are summed beside other rows than in the
# whole prefill, so logits (|x| ~ 3.5) and K/V differ by rounding (about 1e-5 at most here);
# a bound 5x that, far below what separates the greedy ids checked beside it
ATOL = 5e-5


def prompt(n: int, who: str = "agent") -> SegmentedPrompt:
    """About 100 + 25 n tokens."""
    return SegmentedPrompt([
        Segment(SegmentKind.SYSTEM, f"You are a careful {who}. " * n, "sys", "system"),
        Segment(SegmentKind.UPDATE, "list the files of the project", "new", "user"),
    ])  # fmt: skip


def engine(model: LoadedModel, chunk: int | None) -> Engine:
    config = EngineConfig(kv_pages=KV_PAGES, batch_decode=True, prefill_chunk_tokens=chunk)
    return Engine(model, config)


@pytest.mark.parametrize("n", [3, 10, 30])
@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
def test_chunks_agree_with_the_whole_prefill(tiny: LoadedModel, n: int, chunk: int) -> None:
    """Same K/V and first-token logits to fp32 rounding, every token computed once."""
    e = engine(tiny, 0)
    tokens = e.tokenize(prompt(n))
    full = e.strategy("full")
    whole_seq, chunked_seq = SequenceKV(e.ctx.pool), SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        whole = full.prefill(e.ctx, tokens, whole_seq)
        work = chunked.plan(full, e.ctx, tokens, chunked_seq, chunk)
        assert isinstance(work, chunked.ChunkedPrefill)
        assert work.num_chunks == -(-tokens.num_tokens // chunk)
        got = work.run_all()
    assert torch.allclose(got.logits, whole.logits, atol=ATOL, rtol=0)
    assert int(got.logits.argmax()) == int(whole.logits.argmax())
    assert torch.equal(got.positions, whole.positions)
    for layer in range(tiny.config.num_layers):
        for a, b in zip(chunked_seq.gather(layer), whole_seq.gather(layer), strict=True):
            assert torch.allclose(a, b, atol=ATOL, rtol=0)
    s = got.stats
    assert s.recomputed_tokens == tokens.num_tokens
    assert s.token_layers_computed == tokens.num_tokens * tiny.config.num_layers
    layers = tiny.config.num_layers
    assert s.model_calls == work.num_chunks * (2 + 2 * layers)  # embed, project+attend, logits


@pytest.mark.parametrize("family", ["qwen2-window", "gemma3"])
def test_chunks_agree_on_families_with_sliding_windows(family: str) -> None:
    """A window shorter than the prompt: each chunk's queries see their own window's keys."""
    model = tiny_family_model(family)
    assert model.forward.spec.windowed
    e = engine(model, 0)
    tokens = e.tokenize(prompt(6))
    assert tokens.num_tokens > 200
    full = e.strategy("full")
    whole_seq, chunked_seq = SequenceKV(e.ctx.pool), SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        whole = full.prefill(e.ctx, tokens, whole_seq)
        work = chunked.plan(full, e.ctx, tokens, chunked_seq, 24)
        assert isinstance(work, chunked.ChunkedPrefill)
        got = work.run_all()
    assert torch.allclose(got.logits, whole.logits, atol=ATOL, rtol=0)
    for layer in range(model.config.num_layers):
        for a, b in zip(chunked_seq.gather(layer), whole_seq.gather(layer), strict=True):
            assert torch.allclose(a, b, atol=ATOL, rtol=0)


def test_a_prompt_within_one_chunk_runs_whole(tiny: LoadedModel) -> None:
    """One pass over every token, there and then: the whole prefill's result, no chunks."""
    e = engine(tiny, 512)
    tokens = e.tokenize(prompt(3))
    seq, whole_seq = SequenceKV(e.ctx.pool), SequenceKV(e.ctx.pool)
    with torch.inference_mode():
        got = chunked.plan(e.strategy("full"), e.ctx, tokens, seq, tokens.num_tokens)
        whole = e.strategy("full").prefill(e.ctx, tokens, whole_seq)
    assert not isinstance(got, chunked.ChunkedPrefill)
    assert torch.equal(got.logits, whole.logits)
    assert got.stats.model_calls == whole.stats.model_calls == 2 + 2 * tiny.config.num_layers
    assert seq.num_tokens == tokens.num_tokens
    seq.free()
    whole_seq.free()


@pytest.mark.parametrize("chunk", [8, 50])
def test_greedy_outputs_of_chunked_prefills_are_the_whole_prefills(
    tiny: LoadedModel, chunk: int
) -> None:
    """Alone and three at once, each turn's greedy ids are those of the engine that runs every
    prefill whole; the chunks ran in the steps."""
    ref, e = engine(tiny, 0), engine(tiny, chunk)
    params = GenerationParams(max_new_tokens=12)
    sizes = (4, 11, 25)
    want = [ref.generate(prompt(n), params, "full", commit=False) for n in sizes]
    assert ref.batch is not None and ref.batch.stats().prefill_chunks == 0
    alone = [e.generate(prompt(n), params, "full", commit=False) for n in sizes]
    together = at_once(lambda i: e.generate(prompt(sizes[i]), params, "full", commit=False), 3)
    for w, a, t in zip(want, alone, together, strict=True):
        assert a.token_ids == t.token_ids == w.token_ids
        assert torch.allclose(a.first_token_logits, w.first_token_logits, atol=ATOL, rtol=0)
    lengths = [e.tokenize(prompt(n)).num_tokens for n in sizes]
    expected = sum(-(-n // chunk) for n in lengths if n > chunk)
    assert e.batch is not None and e.batch.stats().prefill_chunks == 2 * expected
    assert e.ctx.pool.num_free == KV_PAGES


def decode_during_prefill(e: Engine) -> tuple[Generation, Generation]:
    """Turn A decodes 80 tokens; once it has its second token (it is in the batch, decoding),
    turn B prefills a long prompt, so the steps of B's prefill also feed A."""
    long_decode = GenerationParams(max_new_tokens=80)
    decoding = threading.Event()
    tokens = itertools.count(1)

    def on_token_a(_: int) -> None:
        if next(tokens) == 2:
            decoding.set()

    def turn(i: int) -> Generation:
        if i == 0:
            return e.generate(prompt(2, "clerk"), long_decode, "full", commit=False,
                              on_token=on_token_a)  # fmt: skip
        decoding.wait()
        return e.generate(prompt(14), GenerationParams(max_new_tokens=4), "full", commit=False)

    a, b = at_once(turn, 2)
    return a, b


def test_decoding_turns_advance_during_a_long_chunked_prefill(tiny: LoadedModel) -> None:
    """The steps of B's chunked prefill also produced A's tokens (every one of them but those
    run before B's thread arrived); both turns get the ids they get alone."""
    e = engine(tiny, 8)
    a_alone = e.generate(prompt(2, "clerk"), GenerationParams(max_new_tokens=80), "full",
                         commit=False)  # fmt: skip
    assert len(a_alone.token_ids) == 80  # A outlasts B's prefill: it decodes in every step
    b_alone = e.generate(prompt(14), GenerationParams(max_new_tokens=4), "full", commit=False)
    assert e.batch is not None
    before = e.batch.stats()
    a, b = decode_during_prefill(e)
    after = e.batch.stats()
    chunks_a, chunks_b = (
        -(-e.tokenize(p).num_tokens // 8) for p in (prompt(2, "clerk"), prompt(14))
    )
    assert after.prefill_chunks - before.prefill_chunks == chunks_a + chunks_b
    # A's chunks ran before A decoded; B's ran beside A's decoding, but for the steps B's thread
    # took to arrive after A's second token (scheduling: not counted on a loaded machine)
    mixed = after.mixed_steps - before.mixed_steps
    assert chunks_b // 2 <= mixed <= chunks_b
    # each of those steps ran B's chunk inside A's decode batch (`full`'s plan fuses), but
    # the one that chose A's last token, if B was still prefilling: it feeds A nothing; the
    # other chunks, A's and B's with no turn decoding beside them, ran on their own
    fused = after.fused_chunks - before.fused_chunks
    assert mixed - 1 <= fused <= mixed
    assert after.separate_chunks - before.separate_chunks == chunks_a + chunks_b - fused
    assert (a.token_ids, b.token_ids) == (a_alone.token_ids, b_alone.token_ids)


def cancel_after_first_chunk(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """An event set once the first chunk of a prefill has run, and the sizes of the chunks
    run (from then on, of every chunked prefill)."""
    cancel, ran = threading.Event(), []
    run_chunk = chunked.ChunkedPrefill.run_chunk

    def spy(self: chunked.ChunkedPrefill) -> object:
        ran.append(self.next_size)
        result = run_chunk(self)
        cancel.set()
        return result

    monkeypatch.setattr(chunked.ChunkedPrefill, "run_chunk", spy)
    return cancel, ran


def test_a_prefill_cancelled_between_chunks_frees_its_pages(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event is set after the first chunk: the step looks at it before the next one, so
    no other chunk runs; the turn raises, its pages are back, the next turn is as before."""
    e = engine(tiny, 8)
    assert e.batch is not None
    cancel, ran = cancel_after_first_chunk(monkeypatch)
    with pytest.raises(TurnCancelled):
        e.generate(prompt(14), GenerationParams(max_new_tokens=4), "full", commit=False,
                   cancel=cancel)  # fmt: skip
    assert ran == [8] and e.batch.stats().prefill_chunks == 1  # no chunk after the cancel
    assert e.ctx.pool.num_free == KV_PAGES and e.batch.running == 0
    monkeypatch.undo()
    after = e.generate(prompt(14), GenerationParams(max_new_tokens=4), "full", commit=False)
    ref = engine(tiny, 0).generate(prompt(14), GenerationParams(max_new_tokens=4), "full",
                                   commit=False)  # fmt: skip
    assert after.token_ids == ref.token_ids
    assert e.ctx.pool.num_free == KV_PAGES


@pytest.mark.parametrize("chunk", [8, 0])
def test_a_turn_cancelled_before_its_prefill_runs_none_of_it(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Set while the turn waited (for pages, for the engine's lock): its prefill is never
    planned, whether it would run in chunks or whole, and nothing is stored."""
    e = engine(tiny, chunk)
    planned: list[int] = []
    plan = e._chunked

    def spy(*args: Any) -> Any:
        planned.append(1)
        return plan(*args)

    monkeypatch.setattr(e, "_chunked", spy)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(TurnCancelled):
        e.generate(prompt(14), GenerationParams(max_new_tokens=4), "prefix", cancel=cancel)
    assert planned == [] and e.store.stats.bytes == 0
    assert e.ctx.pool.num_free == KV_PAGES
    e.generate(prompt(14), GenerationParams(max_new_tokens=4), "prefix")  # the spy counts
    assert planned == [1] and e.store.stats.bytes > 0


@pytest.mark.parametrize("policy", ["recompute", "swap"])
def test_a_preempted_turn_recomputes_its_chunked_prompt(tiny: LoadedModel, policy: str) -> None:
    """Four turns whose replies outgrow a pool that holds two: turns are preempted, their
    prompts (run in chunks) recomputed chunk by chunk or swapped back; each gets the ids it
    gets alone."""
    config = EngineConfig(kv_pages=24, batch_decode=True, preemption=policy,
                          preemption_host_bytes=0 if policy == "recompute" else 1 << 30,
                          prefill_chunk_tokens=16)  # fmt: skip
    e = Engine(tiny, config)
    params = GenerationParams(max_new_tokens=150)
    who = ("agent", "clerk", "pilot", "judge")  # prompts of several chunks, replies longer

    def turn(i: int) -> Generation:
        return e.generate(prompt(1, who[i]), params, "full", commit=False)

    alone = [turn(i) for i in range(len(who))]
    together = at_once(turn, len(who))
    assert [t.token_ids for t in together] == [a.token_ids for a in alone]
    stats = e.batch.stats() if e.batch is not None else None
    chunks = sum(-(-e.tokenize(prompt(1, w)).num_tokens // 16) for w in who)
    assert stats is not None and stats.prefill_chunks == 2 * chunks  # alone, then together
    assert stats.preempted > 0
    if policy == "recompute":
        assert stats.recomputed_tokens > 0  # the chunked prompts replayed: the same bits
    assert e.ctx.pool.num_free == 24


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_chunk_budget_names_the_field(bad: object) -> None:
    with pytest.raises(ConfigError, match="prefill_chunk_tokens"):
        EngineConfig(prefill_chunk_tokens=bad)  # type: ignore[arg-type]


def test_no_budget_runs_every_prefill_whole(tiny: LoadedModel) -> None:
    for chunk in (0, None):
        e = engine(tiny, chunk)
        e.generate(prompt(14), GenerationParams(max_new_tokens=2), "full", commit=False)
        assert e.batch is not None and e.batch.stats().prefill_chunks == 0


def test_the_server_takes_a_chunk_budget(capsys: pytest.CaptureFixture[str]) -> None:
    from agentcache.cli import build_parser
    from tests.conftest import usage_error

    parse = build_parser().parse_args
    assert parse(["serve"]).prefill_chunk_tokens is None  # EngineConfig's default
    assert parse(["serve", "--prefill-chunk-tokens", "0"]).prefill_chunk_tokens == 0
    assert parse(["serve", "--prefill-chunk-tokens", "64"]).prefill_chunk_tokens == 64
    assert "--prefill-chunk-tokens" in usage_error(
        ["serve", "--prefill-chunk-tokens", "-1"], capsys
    )
