"""Load-write decoupling == the synchronous load, exactly; dirty pages follow the recompute."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentcache.kv.store import segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import SegmentedPrompt
from agentcache.reuse.segments import REUSABLE
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.tiers import TierConfig, TieredSegmentStore
from agentcache.tiers.versions import adopt_recomputed
from tests.tiers.conftest import agent_turn

GiB = 1 << 30


def engine(model: LoadedModel, strategy: str, decoupled: bool, kv_pages: int = 128) -> Engine:
    tiers = TierConfig(fast_bytes=GiB, decoupled_load=decoupled)
    return Engine(model, EngineConfig(strategy=strategy, kv_pages=kv_pages, tiers=tiers))


def run(e: Engine, turns: int = 3) -> list[Generation]:
    params = GenerationParams(max_new_tokens=6)
    return [e.generate(agent_turn(t), params) for t in range(turns)]


@pytest.mark.parametrize("strategy", ["rpdc", "cacheslide", "cacheblend", "epic", "pic"])
def test_decoupled_load_equals_synchronous_load(tiny: LoadedModel, strategy: str) -> None:
    sync, dec = run(engine(tiny, strategy, False)), run(engine(tiny, strategy, True))
    for a, b in zip(sync, dec, strict=True):
        assert torch.equal(a.first_token_logits, b.first_token_logits)
        assert a.token_ids == b.token_ids
    assert sync[-1].stats.reused_tokens > 0


def test_decoupled_prefill_reports_overlap_and_decode_fills_overlay_pages(
    tiny: LoadedModel,
) -> None:
    e = engine(tiny, "rpdc", True)
    run(e, 2)
    prompt = e.tokenize(agent_turn(2))
    seq, pre = e.prefill(prompt)
    try:
        assert pre.stats.load_overlap is not None and 0.0 <= pre.stats.load_overlap <= 1.0
        assert pre.stats.load_s > 0 and pre.stats.fallbacks == 0
        prompt_pages = -(-prompt.num_tokens // 16)
        overlay = len(seq.table.pages) - prompt_pages
        assert overlay > 0  # recomputed reused tokens were written to overlay pages
        free = e.ctx.pool.num_free
        position = int(pre.positions.max()) + 1
        free_slots = len(seq.table.pages) * 16 - seq.num_tokens
        assert free_slots >= overlay * 16 > 0
        for i in range(free_slots):
            e.step(seq, 65, position + i)
        assert e.ctx.pool.num_free == free  # decode used the overlay pages' free slots
        e.step(seq, 65, position + free_slots)
        assert e.ctx.pool.num_free == free - 1  # then allocates normally
    finally:
        seq.free()


def test_overlay_without_free_pages_falls_back_visibly(tiny: LoadedModel) -> None:
    e = engine(tiny, "rpdc", True, kv_pages=128)
    run(e, 2)
    prompt = e.tokenize(agent_turn(2))
    hog = e.ctx.pool.allocate(e.ctx.pool.num_free - -(-prompt.num_tokens // 16))
    try:
        seq, pre = e.prefill(prompt)
        seq.free()
    finally:
        e.ctx.pool.release(hog)
    assert pre.stats.fallbacks == 1 and "overlay" in pre.stats.fallback_reasons[0]
    ref = engine(tiny, "rpdc", False, kv_pages=128)
    run(ref, 2)
    seq, want = ref.prefill(prompt)
    seq.free()
    assert torch.equal(pre.logits, want.logits)


def scoped_turn(t: int, scope: str | None) -> SegmentedPrompt:
    return SegmentedPrompt([replace(s, scope=scope) for s in agent_turn(t).segments])


@pytest.mark.parametrize("scope", [None, "conv-a"])  # a server conversation's segments are scoped
def test_dirty_pages_count_the_recomputed_reused_tokens(
    tiny: LoadedModel, tmp_path: Path, scope: str | None
) -> None:
    tiers = TierConfig(fast_bytes=GiB, disk_dir=tmp_path, fsync=False)
    e = Engine(tiny, EngineConfig(strategy="rpdc", kv_pages=128, tiers=tiers))
    e.generate(scoped_turn(0, scope), GenerationParams(max_new_tokens=6))
    store = e.store
    assert isinstance(store, TieredSegmentStore)
    assert store.persist() > 0  # every page now has a disk copy: all clean
    prompt = e.tokenize(scoped_turn(1, scope))
    seq, pre = e.prefill(prompt)
    try:
        dirty = pre.stats.dirty
        assert dirty is not None and 0 < int(dirty.sum()) < pre.stats.reused_tokens
        reused = [s for s in prompt.segments if s.kind in REUSABLE]
        assert adopt_recomputed(e.store, tiny, reused, seq, pre.positions, dirty) > 0
    finally:
        seq.free()
    m = tiny
    checked = 0
    for seg in prompt.segments:
        cid = segment_content_id(seg.ids, seg.segment.scope)
        for j, page in enumerate(store.page_info(m.model_id, m.tokenizer.tokenizer_id, cid)):
            start = seg.start + 16 * j
            want = int(dirty[start : min(start + 16, seg.end)].sum())
            assert (page.dirty_tokens, page.clean) == (want, want == 0)
            checked += want > 0
    assert checked > 0


def test_engine_commit_after_prefill_stores_what_generate_stores(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    """`Engine.commit` (the bench harness's path) adopts the dirty pages as `generate` does."""
    engines = []
    for name in ("generate", "commit"):
        tiers = TierConfig(fast_bytes=GiB, disk_dir=tmp_path / name, fsync=False)
        e = Engine(tiny, EngineConfig(strategy="rpdc", kv_pages=128, tiers=tiers))
        run(e, 1)
        store = e.store
        assert isinstance(store, TieredSegmentStore) and store.persist() > 0
        engines.append(e)
    gen, com = engines
    prompt = gen.tokenize(agent_turn(1))
    gen.generate(prompt, GenerationParams(max_new_tokens=1))
    seq, pre = com.prefill(prompt)
    try:
        com.commit(prompt, seq, pre)
    finally:
        seq.free()
    m = tiny
    stores = [e.store for e in engines]
    assert all(isinstance(s, TieredSegmentStore) for s in stores)
    dirty_pages = 0
    for seg in prompt.segments:
        cid = segment_content_id(seg.ids, seg.segment.scope)
        a, b = (s.page_info(m.model_id, m.tokenizer.tokenizer_id, cid) for s in stores)  # type: ignore[attr-defined]
        assert [(p.dirty_tokens, p.clean) for p in a] == [(p.dirty_tokens, p.clean) for p in b]
        dirty_pages += sum(not p.clean for p in a)
    assert dirty_pages > 0
