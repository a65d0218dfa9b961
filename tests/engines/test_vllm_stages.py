"""Staged prefills (vLLM computes, the store supplies) without vLLM: the plan, the stage claim,
store metadata, and a whole staged turn run on fake paged tensors against the embedded engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from agentcache.engines.vllm.config import VLLMConfig
from agentcache.engines.vllm.fill import FillDecider
from agentcache.engines.vllm.layout import CpuLayout, KVShape
from agentcache.engines.vllm.plan import claim_stage
from agentcache.engines.vllm.request import RequestSpec, SegmentSpan
from agentcache.engines.vllm.stages import (
    FillChooser,
    Stage,
    StagePlan,
    engine_tokens,
    exact_prefix_plan,
    exact_prefix_tokens,
    plan_prompt,
    plan_stages,
    staged_strategy,
)
from agentcache.engines.vllm.storage import FolderSegmentStore, StoredMeta
from agentcache.engines.vllm.transfer import PagedKV, StoredRunLoader, save_segments
from agentcache.errors import ConfigError, PromptError
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.pool import SequenceKV
from agentcache.kv.store import SegmentStore, StoredKV, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.reuse.base import ReuseContext, ReuseStats, compute_subset
from agentcache.reuse.selective import (
    ReusedRun,
    SelectiveOptions,
    SelectiveRecompute,
    select_up_front,
)
from agentcache.reuse.spec import StrategySpec
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.runtime.stats import TokenUse
from tests.engines.test_vllm_transfer import _prompt
from tests.reuse.test_contract import agent_prompt

MB = 1 << 20
ONE = GenerationParams(max_new_tokens=1)


def _mask(text: str) -> list[bool]:
    """'cc..c' -> [T, T, F, F, T]: c computed, . reused."""
    return [ch == "c" for ch in text]


def test_each_run_gets_a_stage_that_claims_it_from_a_block_boundary() -> None:
    plan = plan_stages(_mask("....cccc......cc.......c"), block_size=4, min_claim_tokens=1)
    #                         0   4   8     14 16      23
    assert plan.stages == (
        Stage(8, (0, 4)),  # claims the system run from vLLM's hit; vLLM computes [4, 8)
        Stage(16, (8, 14)),  # the run at 8 is aligned already
        Stage(24, (16, 23)),  # the run at 16 starts on a boundary too
    )
    assert plan.computed == tuple(_mask("....cccc......cc.......c"))


def test_a_run_off_a_boundary_starts_at_the_next_one() -> None:
    plan = plan_stages(_mask("cc.........c"), block_size=4, min_claim_tokens=1)
    assert plan.stages == (Stage(4, None), Stage(12, (4, 11)))
    assert plan.computed == tuple(_mask("cccc.......c"))  # two more tokens computed
    assert plan.num_computed == 5 and plan.num_reused == 7 and plan.requested == 3


def test_short_runs_are_computed_and_no_reuse_is_one_stage() -> None:
    plan = plan_stages(_mask("cc...cc.........c"), block_size=4, min_claim_tokens=4)
    # [2, 5) aligns to [4, 5): one token, under the floor; [7, 16) aligns to [8, 16)
    assert plan.stages == (Stage(8, None), Stage(17, (8, 16)))
    single = StagePlan((Stage(5, None),), tuple(_mask("ccccc")), requested=5)
    assert plan_stages(_mask("ccccc"), 4) == single
    with pytest.raises(ValueError, match="last prompt token must be computed"):
        plan_stages(_mask("cc.."), 4)


@pytest.mark.parametrize("seed", range(20))
def test_stages_cover_the_prompt_in_order(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    computed = [*(torch.rand(200, generator=g) < 0.15).tolist(), True]
    plan = plan_stages(computed, block_size=8, min_claim_tokens=8)
    lengths = [s.prompt_len for s in plan.stages]
    assert lengths == sorted(set(lengths)) and lengths[-1] == len(computed)
    claimed = [False] * len(computed)
    for stage in plan.stages:
        if stage.claim is None:
            continue
        start, end = stage.claim
        assert start == 0 or start % 8 == 0
        assert end - start >= 8 and end < stage.prompt_len
        claimed[start:end] = [True] * (end - start)
    # what no stage claims vLLM computes, and it computes at least what was asked
    assert [not c for c in claimed] == list(plan.computed)
    assert all(p or not c for p, c in zip(plan.computed, computed, strict=True))


SPANS = (
    SegmentSpan(SegmentKind.SYSTEM, 0, 10, "sys"),
    SegmentSpan(SegmentKind.UPDATE, 10, 20, "state"),
    SegmentSpan(SegmentKind.FIXED, 20, 40, "h1"),
    SegmentSpan(SegmentKind.UPDATE, 40, 50, "q"),
)


def _stage(claim: tuple[int, int]) -> RequestSpec:
    return RequestSpec(SPANS, None, None, claim, save=False)


def test_stage_claims_the_rest_of_its_run_from_vllms_hit() -> None:
    ids = list(range(50))
    yes = _stage((24, 40))
    assert claim_stage(yes, ids, 24, lambda c: True) == (16, None)
    assert claim_stage(yes, ids, 32, lambda c: True) == (8, None)  # vLLM had more
    assert claim_stage(yes, ids, 40, lambda c: True) == (0, None)  # vLLM has it all
    n, why = claim_stage(yes, ids, 16, lambda c: True)  # the stage before it was evicted
    assert n == 0 and why is not None and "held 16 tokens" in why
    h1 = SPANS[2].content_id(ids)
    n, why = claim_stage(yes, ids, 24, lambda c: c != h1)
    assert n == 0 and why is not None and "h1" in why and "not stored" in why
    assert claim_stage(_stage((0, 0)), ids, 0, lambda c: True) == (0, None)


def test_stage_specs_round_trip_and_bad_ones_are_named() -> None:
    spec = _stage((24, 40))
    back = RequestSpec.parse(spec.to_params(), 50)
    assert back.stage == (24, 40) and back.save is False and back.mode == "staged"
    assert RequestSpec.parse(RequestSpec(SPANS).to_params(), 50).save is True
    clipped = RequestSpec(SPANS).clipped(25)
    assert [s.end for s in clipped.spans] == [10, 20, 25]
    body = spec.to_params()
    for bad, message in (([40, 24], "must lie before"), ([0, 50], "must lie before"),
                         (["a", 3], "is not"), (5, "is not")):  # fmt: skip
        body["agentcache"]["stage"] = bad
        with pytest.raises(PromptError, match=message):
            RequestSpec.parse(body, 50)
    body["agentcache"] |= {"stage": [24, 40], "save": "no"}
    with pytest.raises(PromptError, match="save must be true or false"):
        RequestSpec.parse(body, 50)
    floor = replace(RequestSpec(SPANS), min_reused=0.0)
    assert RequestSpec.parse(floor.to_params(), 50).min_reused == 0.0
    assert RequestSpec.parse(RequestSpec(SPANS).to_params(), 50).min_reused is None
    for bad in (1.5, -0.1, "0", True):
        body = floor.to_params()
        body["agentcache"]["min_reused"] = bad
        with pytest.raises(PromptError, match="min_reused must be a number"):
            RequestSpec.parse(body, 50)


def test_fill_chooser_tries_both_then_runs_the_cheaper_and_looks_again() -> None:
    chooser = FillChooser(warmup=2, revisit=5)
    seen = []
    for _ in range(4):  # warm-up: each twice, in turn; vLLM costs 2 ms/token, the engine 1
        fill = chooser.choose(100, 100)
        seen.append(fill)
        chooser.observe(fill, 200.0 if fill == "vllm" else 100.0, 100)
    assert seen == ["vllm", "engine", "vllm", "engine"]
    assert chooser.cost_ms == {"vllm": 2.0, "engine": 1.0}
    picks = [chooser.choose(100, 100) for _ in range(6)]  # turns 5..10: 5 and 10 revisit
    assert picks == ["vllm", "engine", "engine", "engine", "engine", "vllm"]
    # staged prefills compute a few more tokens; a large enough gap flips the choice
    assert chooser.choose(100, 300) == "vllm"
    chooser.observe("engine", 400.0, 100)  # the engine got slower: 1 + 0.3 * (4 - 1)
    assert chooser.cost_ms["engine"] == pytest.approx(1.9)


def _stored(n: int, start: int, context: str | None) -> StoredKV:
    keys = torch.zeros(2, n, 1, 4)
    return StoredKV(keys, keys.clone(), torch.arange(start, start + n), "m", "t", context)


def test_store_metadata_is_read_without_the_kv(tmp_path: Path) -> None:
    FolderSegmentStore(tmp_path, 64 * MB).put_content("a", _stored(5, 7, "ctx"))
    shifted = _stored(3, 0, None)
    FolderSegmentStore(tmp_path, 64 * MB).put_content("b", replace_positions(shifted, [4, 9, 2]))
    fresh = FolderSegmentStore(tmp_path, 0)  # holds nothing in memory: files only
    a = fresh.meta("m", "t", "a")
    assert a is not None and a.context_id == "ctx"
    assert a.positions is not None and a.positions.tolist() == [7, 8, 9, 10, 11]
    b = fresh.meta("m", "t", "b")
    assert b is not None and b.context_id is None
    assert b.positions is not None and b.positions.tolist() == [4, 9, 2]
    assert fresh.meta("m", "t", "missing") is None
    assert fresh.meta("other-model", "t", "a") is None
    for meta in tmp_path.rglob("*.meta"):  # metadata failing its checksum: a counted miss
        meta.write_text("{not json")
    assert fresh.meta("m", "t", "a") is None and fresh.checksum_failures == 1
    for meta in tmp_path.rglob("*.meta"):  # no metadata: stored, nothing else known
        meta.unlink()
    assert fresh.meta("m", "t", "a") == StoredMeta(None, None)


def replace_positions(kv: StoredKV, positions: list[int]) -> StoredKV:
    return StoredKV(kv.keys, kv.values, torch.tensor(positions), kv.model_id, kv.tokenizer_id)


def test_only_strategies_that_choose_up_front_can_be_staged() -> None:
    for text in ("pic", "epic", "rpdc:selection=offset:extra=1", "epic:boundary_k=16"):
        assert isinstance(staged_strategy(StrategySpec.parse(text)), SelectiveRecompute)
    for text in ("rpdc", "cacheblend", "cacheslide", "full", "prefix", "cacheslide:plan=mode"):
        with pytest.raises(ConfigError, match="cannot run as a staged prefill"):
            staged_strategy(StrategySpec.parse(text))


def _config(text: str) -> EngineConfig:
    spec = StrategySpec.parse(text)
    return EngineConfig(strategy=spec.name, strategy_options={spec.name: spec.options})


def _meta_of(store: SegmentStore, model: LoadedModel) -> Callable[[TokenizedSegment], Any]:
    def meta(seg: TokenizedSegment) -> StoredMeta | None:
        cid = segment_content_id(seg.ids, seg.segment.scope)
        found = store.lookup_content(model.model_id, model.tokenizer.tokenizer_id, cid)
        return None if found.kv is None else StoredMeta(found.kv.context_id, found.kv.positions)

    return meta


@pytest.mark.parametrize(
    "text",
    [
        "pic",
        "epic:boundary_k=8",
        "rpdc:selection=offset:extra=1",
        "rpdc:selection=offset:chunks=span:per_chunk=8",
        "rpdc:selection=offset:exact_prefix=false:extra=0.5",
    ],
)
def test_plan_computes_what_the_embedded_strategy_computes(tiny: LoadedModel, text: str) -> None:
    """With one-token blocks (no alignment) the plan's computed tokens are the strategy's own
    (run as the connector's filler runs it: without update heads, an opening vLLM's prefix
    cache serves)."""
    spec = StrategySpec.parse(text)
    engine = Engine(
        tiny, EngineConfig(strategy=spec.name, strategy_options={spec.name: spec.options})
    )
    engine.ctx = replace(engine.ctx, update_heads=False)
    engine.generate(agent_prompt("memory v1"), ONE)
    prompt = engine.tokenize(agent_prompt("memory v2, a good deal longer than the first one"))
    strategy = staged_strategy(StrategySpec.parse(text))
    plan = plan_prompt(prompt, strategy, _meta_of(engine.store, tiny), 1, 1)
    out = engine.generate(agent_prompt("memory v2, a good deal longer than the first one"), ONE)
    assert out.stats.reused_tokens > 0
    assert plan.num_computed == out.stats.recomputed_tokens


def _paged(model: LoadedModel, blocks: int, block_size: int) -> PagedKV:
    c = model.config
    shape = KVShape(c.num_kv_heads, c.head_dim, block_size)
    layers = [torch.zeros(blocks, c.num_kv_heads, block_size, 2 * c.head_dim)
              for _ in range(c.num_layers)]  # fmt: skip
    return PagedKV(layers, CpuLayout(shape))


class FakeVLLM:
    """vLLM's part of a staged prefill, played by agentcache's forward: a prefix cache that
    holds every earlier stage, a connector that fills the claim, and the forward over the
    rest. One request's pages are blocks 0.. in order."""

    def __init__(self, model: LoadedModel, store: FolderSegmentStore, block_size: int) -> None:
        self.model = model
        self.bs = block_size
        self.paged = _paged(model, 256, block_size)
        self.blocks = list(range(256))
        self.loader = StoredRunLoader(store, model.model_id, "bytes-v1", model.forward.rope)
        self.cached = 0  # tokens whose KV the pages hold (whole blocks: vLLM's prefix cache)
        c = model.config
        from agentcache.kv.pool import PagePool, PoolConfig

        self.pool = PagePool(PoolConfig(c.num_layers, c.num_kv_heads, c.head_dim, 128, 16))
        self.ctx = ReuseContext(model, MemorySegmentStore(0), self.pool)

    def run(self, prompt: TokenizedPrompt, stage: Stage) -> torch.Tensor:
        ids = prompt.ids[: stage.prompt_len]
        hit = min(self.cached, (len(ids) - 1) // self.bs * self.bs)
        spec = RequestSpec.from_prompt(prompt, None).clipped(len(ids))
        spec = replace(spec, stage=stage.claim or (0, 0))
        n, why = claim_stage(spec, ids, hit, lambda c: True)
        assert why is None
        if n:
            fill = self.loader.fill(self.paged, spec, ids, self.blocks, hit, hit + n)
            assert not fill.failed_blocks and fill.reused_tokens == n
        start = hit + n
        # the forward over [start, len): attention over every earlier token's K/V
        seq = SequenceKV(self.pool)
        seq.extend(len(ids))
        keys, values = self.paged.read(self.blocks, 0, start)
        seq.write_all(seq.slots()[:start], keys, values)
        tokenized = TokenizedPrompt((), tuple(ids))
        idx = torch.arange(start, len(ids))
        logits = compute_subset(self.ctx, tokenized, seq, idx, ReuseStats(len(ids), 1))
        keys, values = seq.gather_all(slice(start, len(ids)))
        self.paged.write(self.blocks, start, len(ids), keys, values)
        seq.free()
        self.cached = len(ids) // self.bs * self.bs
        return logits


def _staged_turn(
    tiny: LoadedModel, tmp_path: Path, text: str, block_size: int
) -> tuple[torch.Tensor, StagePlan, TokenizedPrompt, FolderSegmentStore]:
    """Turn 1 computed and stored from the pages; turn 2 run as a staged prefill."""
    engine = Engine(tiny)  # tokenizer only
    store = FolderSegmentStore(tmp_path, 64 * MB)
    first = engine.tokenize(_prompt("step 1"))
    fake = FakeVLLM(tiny, store, block_size)
    fake.run(first, Stage(first.num_tokens, None))
    spec1 = RequestSpec.from_prompt(first, None)
    save_segments(store, tiny.model_id, "bytes-v1", fake.paged, spec1, first.ids, fake.blocks)
    second = engine.tokenize(_prompt("step 2 " * 9))

    def meta(seg: TokenizedSegment) -> StoredMeta | None:
        return store.meta(tiny.model_id, "bytes-v1", segment_content_id(seg.ids))

    plan = plan_prompt(second, staged_strategy(StrategySpec.parse(text)), meta, block_size, 1)
    # the new turn shares with the old one only what vLLM's own cache would hold
    fake.cached = _common_prefix(first.ids, second.ids) // block_size * block_size
    logits = [fake.run(second, stage) for stage in plan.stages][-1]
    return logits, plan, second, store


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("text", ["pic", "epic:boundary_k=8"])
def test_a_staged_turn_equals_the_embedded_strategy(
    tiny: LoadedModel, tmp_path: Path, text: str
) -> None:
    """One-token blocks: the staged turn computes exactly the strategy's tokens, so its
    first-token logits are the embedded engine's for the same store."""
    logits, plan, _, _ = _staged_turn(tiny, tmp_path, text, block_size=1)
    assert len(plan.stages) >= 2 and plan.num_reused > 0
    ref = Engine(tiny, _config(text), store=FolderSegmentStore(tmp_path, 64 * MB))
    out = ref.generate(_prompt("step 2 " * 9), ONE)
    assert out.stats.recomputed_tokens == plan.num_computed
    torch.testing.assert_close(logits, out.first_token_logits, atol=1e-4, rtol=1e-4)


def test_a_staged_turn_with_blocks_computes_its_plan_and_no_more(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    """With 8-token blocks the plan computes a few more tokens than pic; the turn equals a
    reference that computes exactly the plan's tokens over the re-rotated stored KV."""
    logits, plan, second, store = _staged_turn(tiny, tmp_path, "pic", block_size=8)
    assert any(s.claim and s.claim[0] % 8 == 0 and s.claim[0] > 0 for s in plan.stages)
    ref = Engine(tiny, store=FolderSegmentStore(tmp_path, 64 * MB))
    seq = SequenceKV(ref.ctx.pool)
    seq.extend(second.num_tokens)
    for s in second.segments:  # every stored segment's KV, re-rotated where the plan reuses it
        found = store.lookup_content(tiny.model_id, "bytes-v1", segment_content_id(s.ids))
        if found.kv is None:
            continue
        new = torch.arange(s.start, s.end)
        keys = tiny.forward.rope.rerotate(found.kv.keys, found.kv.positions, new)
        seq.write_all(seq.slots()[s.start : s.end], keys, found.kv.values)
    idx = torch.tensor([i for i, c in enumerate(plan.computed) if c])
    expect = compute_subset(ref.ctx, second, seq, idx, ReuseStats(second.num_tokens, 1))
    seq.free()
    torch.testing.assert_close(logits, expect, atol=1e-4, rtol=1e-4)


def test_exact_prefix_and_engine_token_estimates() -> None:
    runs = [ReusedRun(0, 10, exact=True), ReusedRun(10, 10, exact=True), ReusedRun(25, 5, True)]
    assert exact_prefix_tokens(runs, 8) == 16  # [0, 20) exact, in whole blocks
    assert exact_prefix_tokens([ReusedRun(0, 10), *runs[1:]], 8) == 0
    o = SelectiveOptions(probe_layers=10, extra=0.5, selection="attention")
    selection = select_up_front(o, 40, [ReusedRun(5, 30)])
    assert engine_tokens(selection) == 10 + 5  # base: [0, 5) and [35, 40); budget 0.5 each


def _decider(tmp_path: Path, fill: str, strategy: str, tiny: LoadedModel) -> FillDecider:
    """The backend's decision inputs without a vLLM engine (its store is the folder)."""
    config = VLLMConfig(fill=fill, strategy=strategy, min_stage_tokens=8)
    ids = (tiny.model_id, tiny.tokenizer.tokenizer_id)
    return FillDecider(config, FolderSegmentStore(tmp_path, 0), ids)


def test_the_backend_decides_who_computes(tiny: LoadedModel, tmp_path: Path) -> None:
    engine = Engine(tiny, store=FolderSegmentStore(tmp_path, 64 * MB))
    engine.generate(_prompt("step 1"), ONE)  # stores its segments (and their metadata)
    warm = engine.tokenize(_prompt("step 2 " * 9))

    def decide(fill: str, strategy: str, prompt: TokenizedPrompt) -> tuple[Any, ...]:
        d = _decider(tmp_path, fill, strategy, tiny).decide(prompt, None)
        return d.plan, d.fill, d.chosen

    assert decide("engine", "pic", warm) == (None, "engine", False)
    plan, fill, chosen = decide("vllm", "pic", warm)
    assert fill == "vllm" and not chosen and plan is not None and len(plan.stages) == 2
    other = engine.tokenize(SegmentedPrompt([Segment(SegmentKind.SYSTEM, "new words " * 20)]))
    plan, fill, chosen = decide("auto", "pic", other)  # nothing stored: vLLM, no choice made
    assert fill == "vllm" and not chosen and plan is not None and len(plan.stages) == 1
    # the segments the store lacked, read once while planning (a staged turn's `new` misses)
    lacked = _decider(tmp_path, "auto", "pic", tiny).decide(other, None).unstored
    assert [s.segment.text for s in lacked] == ["new words " * 20]
    known = _decider(tmp_path, "auto", "pic", tiny).decide(warm, None).unstored
    assert known == ()  # every reusable segment (system, history) stored by the first turn
    plan, fill, chosen = decide("auto", "pic", warm)  # both can: measured (vLLM first)
    assert (fill, chosen) == ("vllm", True) and plan is not None and plan.num_reused > 0
    assert decide("auto", "full", warm) == (None, "engine", False)
    # rpdc ranks while it runs: the engine fills, or vLLM computes everything after the
    # stored exact prefix, which the turn's request claims (loaded where vLLM evicted it)
    decider = _decider(tmp_path, "auto", "rpdc", tiny)
    d = decider.decide(warm, None)
    assert (d.fill, d.chosen) == ("vllm", True) and d.plan is not None
    stored = warm.segments[1].start  # the system segment, stored after the same context
    hit = stored // 32 * 32
    assert hit > 0 and d.plan.stages == (Stage(warm.num_tokens, (0, hit)),)
    assert d.plan.computed == tuple([False] * hit + [True] * (warm.num_tokens - hit))
    decider.chooser().observe("vllm", 100.0, 10)
    d = decider.decide(warm, None)
    assert (d.fill, d.chosen) == ("engine", True)


def test_the_exact_prefix_plan_claims_the_stored_prefix_and_computes_the_rest() -> None:
    plan = exact_prefix_plan(10, 8, 4)
    assert plan.stages == (Stage(10, (0, 8)),)
    assert plan.computed == tuple(_mask("........cc")) and plan.exact == tuple(_mask("cccccccc.."))
    assert exact_prefix_plan(10, 10, 4).stages == (Stage(10, (0, 9)),)  # the last token: vLLM
    assert exact_prefix_plan(10, 2, 4).stages == (Stage(10, None),)  # under a block: computed
    assert exact_prefix_plan(10, 0, 4).computed == tuple([True] * 10)


def test_a_staged_turns_token_reuse_adds_up_to_what_vllm_computed() -> None:
    """vLLM's own hit and the claimed runs are reused (exact where the stored KV was computed
    after this very context, else moved); the rest computed. A count that does not add up
    (a claim declined at run time) gives None, not a guess."""
    plan = replace(plan_stages(_mask("cc....cc..c"), 1, 1), exact=tuple(_mask("..cccc.....")))
    uses = plan.token_reuse(vllm_hit=1, computed_tokens=4)
    assert uses is not None
    assert [(s, e, u.value) for s, e, u in uses.runs] == [
        (0, 1, "exact"), (1, 2, "computed"), (2, 6, "exact"), (6, 8, "computed"),
        (8, 10, "moved"), (10, 11, "computed"),
    ]  # fmt: skip
    assert plan.token_reuse(vllm_hit=1, computed_tokens=6) is None  # a run vLLM computed
    bare = plan_stages(_mask("cc....cc..c"), 1, 1)  # exactness not known: claimed are moved
    known = bare.token_reuse(vllm_hit=0, computed_tokens=5)
    assert known is not None and known.count(TokenUse.MOVED) == 6
    assert known.count(TokenUse.EXACT) == 0
