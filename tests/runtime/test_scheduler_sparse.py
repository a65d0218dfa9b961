"""Sparse decoders' turns in the scheduler's batch: each gets the tokens and decode stats it
gets alone, beside dense turns and turns of other policies; verified decoding's drafts are
rows of the batch and give what its decoder's own `feed` gives."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import torch

from agentcache.decode.base import Decoder
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.dense import DenseDecoder
from agentcache.decode.profile import save_profile
from agentcache.decode.setup import DecodeSetup, fast_tier_pages
from agentcache.decode.stats import DecodeStats
from agentcache.decode.verified import VerifiedDecoder
from agentcache.kv.pool import SequenceKV
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime import scheduler
from agentcache.runtime.batch_step import CallRule
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.runtime.loop import TurnDecoding, decode_loop
from tests.conftest import at_once
from tests.decode.conftest import TEXT, make_profile

KV_PAGES = 256

# (policy, decode options, prompt characters, max_new_tokens) per turn
TURNS = [
    ("dense", {}, 200, 20),
    ("quest", {}, 700, 24),
    ("flexicache", {"policy_options": {"stable_interval": 4}}, 900, 30),
    ("streaming", {"policy_options": {"window": 2, "stable_interval": 4}}, 1100, 18),
    ("dense", {}, 450, 26),
    ("multiscale", {"top_p": 0.9}, 500, 22),
]


@pytest.fixture
def profile_file(tiny: LoadedModel, tmp_path: Path) -> Path:
    return save_profile(make_profile(tiny), tmp_path / "profile.json")


def prompt(chars: int) -> SegmentedPrompt:
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, TEXT[:chars])])


def decoder(
    e: Engine, i: int, profile: Path, verify: int = 0
) -> tuple[Decoder, TurnDecoding, SequenceKV]:
    """Turn i prefilled on `e`, its decoder as the engine builds it for turn i's policy, and
    the sequence that holds its pages (a sparse decoder's: its fast tier's, unwritten)."""
    policy, options, chars, new = TURNS[i]
    seq, pre = e.prefill(e.tokenize(prompt(chars)), "full")
    params = GenerationParams(max_new_tokens=new)
    turn = TurnDecoding(pre.logits, seq.num_tokens, params, 4096, e.model.tokenizer)
    config = DecodeConfig(policy, budget_pages=3, profile=profile, verify=verify, **options)  # type: ignore[arg-type]
    dense = DenseDecoder(e.step, seq, KV_PAGES * 16)
    return DecodeSetup.resolve(e.model, config).decoder(e.model, seq, new, True, dense), turn, seq


def run(
    e: Engine, turns: list[int], profile: Path, verify: int = 0
) -> list[tuple[list[int], DecodeStats | None]]:
    """Turns joined together to `e`'s scheduler, stepped to their end from this thread: each
    one's ids and decode stats (time left out)."""
    assert e.batch is not None
    made = [decoder(e, i, profile, verify if i == 1 else 0) for i in turns]
    running = [e.batch.join(turn, d) for d, turn, _ in made]
    while not all(r.finished for r in running):
        e.batch.step()
    for r, (_, _, seq) in zip(running, made, strict=True):
        e.batch.leave(r)
        seq.free()
    out = []
    for d, turn, _ in made:
        stats = d.stats()
        out.append((turn.ids, None if stats is None else dataclasses.replace(stats, rerank_s=0.0)))
    return out


def engine(model: LoadedModel) -> Engine:
    return Engine(model, EngineConfig(kv_pages=KV_PAGES, batch_decode=True))


def test_dense_and_sparse_turns_of_a_batch_get_what_they_get_alone(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """Six turns (dense and four sparse policies, different prompt lengths and lengths) in one
    batch: every turn's greedy ids, and a sparse turn's decode stats, are those it gets alone;
    the sparse rows were batched, none fed on its own."""
    e = engine(tiny)
    alone = [run(e, [i], profile_file)[0] for i in range(len(TURNS))]
    assert all(len(ids) > 8 for ids, _ in alone)  # long enough to decode side by side
    before = e.batch.stats() if e.batch else None
    assert before is not None and before.batched_rows == 0 and before.solo_feeds == 0
    together = run(e, list(range(len(TURNS))), profile_file)
    assert together == alone
    after = e.batch.stats() if e.batch else None
    assert after is not None and after.solo_feeds == 0
    sparse_steps = sum(s.steps for _, s in alone if s is not None)
    assert 0 < after.batched_sparse_feeds <= sparse_steps
    assert after.batched_sparse_feeds >= sparse_steps - 2 * after.lone_steps  # the last ones
    assert after.peak_batch == len(TURNS)
    assert e.ctx.pool.num_free == KV_PAGES


def verified_by_feed(e: Engine, profile: Path) -> tuple[list[int], DecodeStats | None]:
    """Turn 1 under verify=4 decoded by its decoder's own `feed` (`decode_loop`, rounds of
    `SparseDecoder.advance`): the reference of its drafts run as batched rows."""
    d, turn, seq = decoder(e, 1, profile, verify=4)
    assert isinstance(d, VerifiedDecoder)
    assert isinstance(turn.after, torch.Tensor)
    with torch.inference_mode():
        ids, _ = decode_loop(d, turn.after, turn.position, turn.params, 4096, e.model.tokenizer)
    seq.free()
    stats = d.stats()
    return ids, dataclasses.replace(stats, rerank_s=0.0)


def test_a_verified_turns_drafts_are_rows_of_the_batch(
    tiny: LoadedModel, profile_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verified decoding's drafts run as rows of the batched steps, a row per step, then its
    dense pass as a row of the round's tokens: beside other turns or alone, its ids and decode
    stats (drafts, acceptances, passes) are those of its decoder's own `feed`, and the turns
    beside it get what they get alone. The tokens a pass verifies are fed in the pass's step,
    those beyond the first with no model work (solo feeds), fewer than it emits."""
    e = engine(tiny)
    reference = verified_by_feed(e, profile_file)
    ref_stats = reference[1]
    assert ref_stats is not None and ref_stats.verify_passes > 1
    assert 0 < ref_stats.accepted_tokens < ref_stats.drafted_tokens  # some kept, some not
    assert e.batch is not None
    alone = [run(e, [0], profile_file, verify=4)[0]]
    before = e.batch.stats()
    alone.append(run(e, [1], profile_file, verify=4)[0])
    lone = e.batch.stats()
    alone.append(run(e, [2], profile_file, verify=4)[0])
    assert alone[1] == reference
    # alone, a round takes a step per draft and one for its pass, whose step feeds the turn
    # every token it verified (those beyond the first with no model work); one more step
    # chooses the turn's last token
    assert lone.steps - before.steps == ref_stats.drafted_tokens + ref_stats.verify_passes + 1
    assert lone.solo_feeds - before.solo_feeds == ref_stats.accepted_tokens
    assert run(e, [0, 1, 2], profile_file, verify=4) == alone
    # beside a dense turn only: every sparse row is one of its drafts or dense passes, and no
    # pass runs as a call of its own (`verify`, the reference's)
    before = e.batch.stats()
    with monkeypatch.context() as m:
        m.setattr(SparseDecoder, "verify", lambda *_: pytest.fail("a pass outside the step"))
        assert run(e, [0, 1], profile_file, verify=4) == alone[:2]
    after = e.batch.stats()
    solo = after.solo_feeds - before.solo_feeds
    drafts = after.batched_sparse_feeds - before.batched_sparse_feeds
    lone = after.lone_steps - before.lone_steps
    assert len(alone[0][0]) // 2 < drafts <= ref_stats.drafted_tokens + ref_stats.verify_passes
    assert drafts + lone >= ref_stats.drafted_tokens + ref_stats.verify_passes
    assert 0 < solo < len(reference[0])


def test_a_round_dense_agrees_with_brings_its_bonus_in_the_batch(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """Drafts dense agrees with (a budget that holds every page): each round's pass, a row of
    the batch beside a dense turn, covers the round's last draft too, and the turn takes the 4
    drafts and dense's next token in the pass's step; ids and decode stats those of its own
    `feed`, in 5 steps a round."""
    e = engine(tiny)
    assert e.batch is not None
    config = DecodeConfig(
        "quest", budget_pages=64, profile=profile_file, verify=4, short_dense=False
    )
    params = GenerationParams(max_new_tokens=21)

    def verified() -> tuple[Decoder, TurnDecoding, SequenceKV]:
        seq, pre = e.prefill(e.tokenize(prompt(700)), "full")
        turn = TurnDecoding(pre.logits, seq.num_tokens, params, 4096, e.model.tokenizer)
        dense = DenseDecoder(e.step, seq, KV_PAGES * 16)
        with pytest.warns(UserWarning, match="every page is attended"):
            d = DecodeSetup.resolve(e.model, config).decoder(e.model, seq, 21, True, dense)
        return d, turn, seq

    d, turn, seq = verified()
    assert isinstance(turn.after, torch.Tensor)
    with torch.inference_mode():
        ids, _ = decode_loop(d, turn.after, turn.position, params, 4096, e.model.tokenizer)
    seq.free()
    want = d.stats()
    assert want is not None and want.accepted_tokens == want.drafted_tokens == 16
    assert want.verify_passes == 4 and len(ids) == 21  # the first token, then 4 rounds of 5

    d, turn, seq = verified()
    other, other_turn, other_seq = decoder(e, 0, profile_file)
    before = e.batch.stats()
    running = [e.batch.join(turn, d), e.batch.join(other_turn, other)]
    steps = 0
    while not running[0].finished:
        e.batch.step()
        steps += 1
    while not running[1].finished:
        e.batch.step()
    for r in running:
        e.batch.leave(r)
    seq.free()
    other_seq.free()
    got = d.stats()
    assert turn.ids == ids
    assert got is not None and dataclasses.replace(got, rerank_s=0.0) == dataclasses.replace(
        want, rerank_s=0.0
    )
    assert steps == 4 * 5 + 1  # 4 drafts and the pass a round; one step chooses the last
    assert e.batch.stats().solo_feeds - before.solo_feeds == 4 * 4  # a round's 4 beyond the first


def test_a_pass_that_would_take_another_call_waits_a_step(
    tiny: LoadedModel, profile_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verified round's dense pass that would take the step's decode rows into one more
    matrix-product call waits for the next step, once, and then runs whatever it costs: beside
    a dense turn, under a rule of a call per 4 rows, every pass waits one step; the turns' ids
    and decode stats are unchanged, and each wait costs the turn one step."""
    e = engine(tiny)
    assert e.batch is not None
    before = e.batch.stats()
    alone = run(e, [0, 1], profile_file, verify=4)
    unpatched = e.batch.stats()
    assert unpatched.deferred_rows == before.deferred_rows  # 1 + 5 rows: one call either way
    # the scheduler's view of the calls only: the step's own matrix products keep their rule
    monkeypatch.setattr(scheduler, "call_rule", lambda _: CallRule(4, 4))
    assert run(e, [0, 1], profile_file, verify=4) == alone
    after = e.batch.stats()
    deferred = after.deferred_rows - unpatched.deferred_rows
    passes = alone[1][1].verify_passes if alone[1][1] else 0
    assert 0 < deferred <= passes
    steps = unpatched.steps - before.steps
    assert after.steps - unpatched.steps == steps + deferred


def test_verified_requests_at_once_decode_what_dense_decodes(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """Three concurrent requests of a verified engine (different prompts and lengths, one
    with a stop string) get dense greedy decoding's output, their drafts batched."""
    config = DecodeConfig("quest", budget_pages=3, profile=profile_file, verify=4)
    dense = Engine(tiny, EngineConfig(kv_pages=KV_PAGES, batch_decode=True))
    e = Engine(tiny, EngineConfig(kv_pages=KV_PAGES, batch_decode=True, decode=config))
    chars = (600, 1000, 800)
    params = [GenerationParams(max_new_tokens=20), GenerationParams(max_new_tokens=31),
              GenerationParams(max_new_tokens=26)]  # fmt: skip
    want = [dense.generate(prompt(chars[i]), params[i], "full", commit=False).text
            for i in range(3)]  # fmt: skip
    params[2] = dataclasses.replace(params[2], stop=(want[2][len(want[2]) // 2 :][:3],))

    def one(i: int) -> tuple[list[int], str]:
        gen = e.generate(prompt(chars[i]), params[i], "full", commit=False)
        s = gen.stats.decode
        assert s is not None and s.verify_passes > 0 and not s.verify_skipped
        return list(gen.token_ids), gen.text

    alone = [one(i) for i in range(3)]
    assert [text for _, text in alone[:2]] == want[:2]
    assert want[2].startswith(alone[2][1]) and len(alone[2][1]) < len(want[2])  # stopped
    assert e.batch is not None and e.batch.stats().batched_sparse_feeds == 0
    assert at_once(one, 3) == alone
    assert e.batch.stats().batched_sparse_feeds > 0
    assert e.ctx.pool.num_free == KV_PAGES


def test_sparse_turns_through_the_engine_get_their_output_alone(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """A sparse-policy engine's concurrent requests (different prompts, one sampled) give each
    the ids and decode stats it gets alone, their steps batched."""
    config = DecodeConfig("flexicache", budget_pages=3, profile=profile_file,
                          policy_options={"stable_interval": 4})  # fmt: skip
    e = Engine(tiny, EngineConfig(kv_pages=KV_PAGES, batch_decode=True, decode=config))
    params = [GenerationParams(max_new_tokens=20), GenerationParams(max_new_tokens=28),
              GenerationParams(max_new_tokens=16, temperature=0.8, seed=5)]  # fmt: skip
    chars = (600, 1000, 800)

    def one(i: int) -> tuple[list[int], DecodeStats | None]:
        gen = e.generate(prompt(chars[i]), params[i], "full", commit=False)
        s = gen.stats.decode
        return list(gen.token_ids), None if s is None else dataclasses.replace(s, rerank_s=0.0)

    alone = [one(i) for i in range(3)]
    assert e.batch is not None and e.batch.stats().batched_sparse_feeds == 0
    assert at_once(one, 3) == alone
    assert e.batch.stats().batched_sparse_feeds > 0 and e.batch.stats().solo_feeds == 0
    assert all(s is not None and s.steps > 0 for _, s in alone)


def test_a_sparse_turn_holds_its_fast_tier_in_the_pool(
    tiny: LoadedModel, profile_file: Path
) -> None:
    """Once its decoder is made, a sparse turn's sequence holds the pages its fast tier
    (arena and page metadata) would fill, fewer than its prompt took and at least one; freed
    with the turn."""
    e = engine(tiny)
    d, _, seq = decoder(e, 2, profile_file)  # flexicache
    prompt_pages = -(-e.tokenize(prompt(TURNS[2][2])).num_tokens // 16)
    assert isinstance(d, SparseDecoder)
    held = fast_tier_pages(d, e.ctx.pool.config.page_bytes)
    stats = d.stats()
    assert held * e.ctx.pool.config.page_bytes >= stats.fast_tier_kv_bytes + stats.metadata_bytes
    assert 1 <= held < prompt_pages
    assert KV_PAGES - e.ctx.pool.num_free == held == len(seq.table.pages)
    seq.free()
    assert e.ctx.pool.num_free == KV_PAGES


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "interleaved"])
def test_the_pool_bounds_sparse_turns_by_their_fast_tier(
    tiny: LoadedModel, profile_file: Path, batch: bool
) -> None:
    """A pool with room for one turn's prompt and one fast tier: dense turns run one at a
    time, sparse ones two at a time (a sparse turn admitted once the one before it shrank to
    its fast tier, not only when it ends), never three; each gets its output alone. Batched
    or interleaved token by token alike."""
    config = DecodeConfig("flexicache", budget_pages=3, profile=profile_file,
                          policy_options={"stable_interval": 4})  # fmt: skip
    params = GenerationParams(max_new_tokens=24)
    probe = Engine(tiny, EngineConfig(kv_pages=KV_PAGES, batch_decode=True, decode=config))
    tokens = probe.tokenize(prompt(900))
    turn_pages = probe._pages_for(tokens, params)
    d, _, seq = decoder(probe, 2, profile_file)
    assert isinstance(d, SparseDecoder)
    held = fast_tier_pages(d, probe.ctx.pool.config.page_bytes)
    seq.free()
    assert held < turn_pages
    # the first turn, shrunk, leaves the second room; the second, shrunk, leaves none
    pages = turn_pages + held

    def peak(decode: DecodeConfig) -> int:
        e = Engine(tiny, EngineConfig(kv_pages=pages, batch_decode=batch, decode=decode))
        alone = e.generate(tokens, params, "full", commit=False).token_ids
        together = at_once(lambda _: e.generate(tokens, params, "full", commit=False).token_ids, 3)
        assert together == [alone] * 3
        assert e.ctx.pool.num_free == pages
        return e.gate.peak_running

    assert peak(DecodeConfig()) == 1
    assert peak(config) == 2


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "interleaved"])
def test_a_sparse_decoders_set_up_runs_outside_the_engines_lock(
    tiny: LoadedModel, profile_file: Path, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    """The set-up that copies a turn's KV into head pages holds no engine lock (other turns
    step meanwhile); the turns still get their output alone."""
    config = DecodeConfig("flexicache", budget_pages=3, profile=profile_file,
                          policy_options={"stable_interval": 4})  # fmt: skip
    e = Engine(tiny, EngineConfig(kv_pages=KV_PAGES, batch_decode=batch, decode=config))
    held: list[bool] = []
    build = SparseDecoder.__init__

    def watched(self: SparseDecoder, *args: object, **kwargs: object) -> None:
        held.append(e._lock._owner == threading.get_ident())
        build(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SparseDecoder, "__init__", watched)
    params = GenerationParams(max_new_tokens=12)

    def one(i: int) -> list[int]:
        return list(e.generate(prompt(600 + 300 * i), params, "full", commit=False).token_ids)

    alone = [one(i) for i in range(3)]
    assert at_once(one, 3) == alone
    assert held == [False] * 6
    assert e.ctx.pool.num_free == KV_PAGES


def test_the_steps_time_is_counted_by_row_kind(tiny: LoadedModel, profile_file: Path) -> None:
    """A dense turn beside a verified sparse one: the scheduler's `step_seconds` counts dense
    rows', sparse rows' and verify passes' attention, the shared rest and steps alone; a row
    of a verified round is its sparse row's kind."""
    e = engine(tiny)
    assert e.batch is not None
    before = e.batch.stats().step_seconds
    run(e, [0, 1], profile_file, verify=4)
    after = e.batch.stats().step_seconds
    grew = {k for k, v in after.items() if v > before.get(k, 0.0)}
    assert {"attention:dense", "attention:sparse", "attention:verify", "rest"} <= grew
    assert after["chunks"] == before.get("chunks", 0.0) == 0.0
    made, _, seq = decoder(e, 1, profile_file, verify=4)
    assert isinstance(made, VerifiedDecoder)
    row = made.begin_step(e.model.forward, 1, seq.num_tokens, 8)
    assert row is not None and row.kind == "sparse"
    seq.free()
