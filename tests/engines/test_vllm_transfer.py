"""The connector's worker mechanics on a tiny model and fake paged tensors (no vLLM): prefix
blocks out and back, segment save, and the segment filler against agentcache's own engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentcache.engines.vllm import VLLMUnavailableError, check_version
from agentcache.engines.vllm.layout import CpuLayout, KVShape
from agentcache.engines.vllm.modes import RequestWork, StagedMode, StoreKeys
from agentcache.engines.vllm.request import RequestSpec
from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.engines.vllm.transfer import (
    MAX_STRATEGIES,
    PagedKV,
    PrefixTransfer,
    SegmentFiller,
    layer_order,
    save_segments,
    stored_inexact_from,
)
from agentcache.kv.store import MissReason, inexact_context, segment_content_id
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.segments import context_ids
from agentcache.runtime.engine import Engine, EngineConfig

BS = 32
MB = 1 << 20


def _paged(model: LoadedModel, blocks: int = 12) -> PagedKV:
    c = model.config
    shape = KVShape(c.num_kv_heads, c.head_dim, BS)
    layers = [torch.zeros(blocks, c.num_kv_heads, BS, 2 * c.head_dim) for _ in range(c.num_layers)]
    return PagedKV(layers, CpuLayout(shape))


def _vllm_prefill(model: LoadedModel, paged: PagedKV, ids: list[int], block_ids: list[int]) -> None:
    """What vLLM does for an uncached prompt: every token's K/V into its pages."""
    out = model.forward.forward(torch.tensor(ids))
    paged.write(block_ids, 0, len(ids), out.keys, out.values)


def _prompt(update: str) -> SegmentedPrompt:
    return SegmentedPrompt(
        [
            Segment(SegmentKind.SYSTEM, "You are a careful agent. " * 3, "sys"),
            Segment(SegmentKind.UPDATE, update, "state"),
            Segment(
                SegmentKind.FIXED, "Earlier: the user asked about the weather in Paris. ", "h1"
            ),
            Segment(SegmentKind.FIXED, "Then the tool said it was sunny and warm. ", "h2"),
            Segment(SegmentKind.UPDATE, "Now answer: the weather", "q"),
        ]
    )


def test_prefix_blocks_round_trip_through_a_second_store(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = [
        int(x) for x in torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(1))
    ]
    first = _paged(tiny)
    _vllm_prefill(tiny, first, ids, [0, 1, 2, 3])
    saver = PrefixTransfer(FolderSegmentStore(tmp_path, 64 * MB), tiny.model_id, "bytes-v1")
    assert saver.save(first, ids, [0, 1, 2, 3]) == 3  # full blocks only
    assert saver.save(first, ids, [0, 1, 2, 3]) == 0  # already stored
    second = _paged(tiny)
    loader = PrefixTransfer(FolderSegmentStore(tmp_path, 64 * MB), tiny.model_id, "bytes-v1")
    assert loader.load(second, ids, [7, 5, 9, 11], 0, 96) == []
    k1, v1 = first.read([0, 1, 2, 3], 0, 96)
    k2, v2 = second.read([7, 5, 9, 11], 0, 96)
    assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_prefix_load_reports_corrupted_blocks(tiny: LoadedModel, tmp_path: Path) -> None:
    ids = list(range(70))
    first = _paged(tiny)
    _vllm_prefill(tiny, first, ids, [0, 1, 2])
    PrefixTransfer(FolderSegmentStore(tmp_path, 64 * MB), tiny.model_id, "t").save(
        first, ids, [0, 1, 2]
    )
    for path in tmp_path.rglob("*.kv"):
        path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    store = FolderSegmentStore(tmp_path, 64 * MB)
    failed = PrefixTransfer(store, tiny.model_id, "t").load(_paged(tiny), ids, [4, 5, 6], 0, 64)
    assert failed == [4, 5] and store.checksum_failures == 2


def _filled(
    tiny: LoadedModel,
    tmp_path: Path,
    strategy: str,
    first: SegmentedPrompt,
    second: SegmentedPrompt,
) -> tuple[torch.Tensor, torch.Tensor, Engine]:
    """Turn 1 computed by 'vLLM' and saved from its pages; turn 2 filled by the connector.
    Returns the filled span's keys, the engine reference's keys for it, and the engine."""
    engine = Engine(tiny, EngineConfig(strategy=strategy))
    store = FolderSegmentStore(tmp_path, 64 * MB)
    p1 = engine.tokenize(first)
    pages = _paged(tiny, blocks=40)
    blocks1 = list(range(20, 20 + -(-p1.num_tokens // BS)))
    _vllm_prefill(tiny, pages, list(p1.ids), blocks1)
    spec1 = RequestSpec.from_prompt(p1, strategy)
    written = save_segments(store, tiny.model_id, "bytes-v1", pages, spec1, p1.ids, blocks1)
    assert written == len(p1.segments)
    p2 = engine.tokenize(second)
    blocks2 = list(range(-(-p2.num_tokens // BS)))
    filler = SegmentFiller(tiny, store, 4096, strategy)
    start, end = 0, p2.num_tokens - 1
    filled = filler.fill(pages, RequestSpec.from_prompt(p2, strategy), p2.ids, blocks2, start, end)
    assert filled.stats.reused_tokens > 0
    keys, _ = pages.read(blocks2, start, end)
    # the reference: agentcache's own engine, same strategy, same store contents
    ref_store = FolderSegmentStore(tmp_path, 64 * MB)
    ref = Engine(tiny, EngineConfig(strategy=strategy), store=ref_store)
    seq, _ = ref.prefill(p2)
    ref_keys = seq.gather_all(slice(start, end))[0]
    seq.free()
    return keys, ref_keys, ref


@pytest.mark.parametrize("strategy", ["pic", "rpdc"])
def test_filler_writes_what_agentcache_engine_computes(
    tiny: LoadedModel, tmp_path: Path, strategy: str
) -> None:
    """Fast path (vLLM pages + connector) == reference (the embedded engine) on a turn whose
    fixed segments shifted because the update before them grew."""
    keys, ref_keys, _ = _filled(tiny, tmp_path, strategy, _prompt("step 1"), _prompt("step 2 " * 9))
    assert torch.allclose(keys, ref_keys, atol=1e-5)


def test_filler_with_nothing_changed_equals_full_compute(tiny: LoadedModel, tmp_path: Path) -> None:
    p = _prompt("same state")
    keys, _, ref = _filled(tiny, tmp_path, "rpdc", p, p)
    full = tiny.forward.forward(torch.tensor(ref.tokenize(p).ids))
    assert torch.allclose(keys, full.keys[:, : keys.shape[1]], atol=1e-4)


def test_segments_saved_from_pages_are_found_by_the_embedded_engine(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    engine = Engine(tiny, store=FolderSegmentStore(tmp_path, 64 * MB))
    p = engine.tokenize(_prompt("x"))
    pages = _paged(tiny)
    blocks = list(range(-(-p.num_tokens // BS)))
    _vllm_prefill(tiny, pages, list(p.ids), blocks)
    save_segments(
        engine.store,
        tiny.model_id,
        "bytes-v1",
        pages,
        RequestSpec.from_prompt(p, None),
        p.ids,
        blocks,
    )
    g = engine.generate(_prompt("y" * 40))
    assert g.stats.reused_tokens > 0
    assert all(m.reason != MissReason.CHECKSUM for m in g.stats.misses)


def test_layer_order_sorts_by_layer_number() -> None:
    names = [f"model.layers.{i}.self_attn.attn" for i in (10, 2, 1)]
    assert layer_order(names) == [names[2], names[1], names[0]]


def test_version_gate_names_the_extra_and_the_pin() -> None:
    with pytest.raises(VLLMUnavailableError, match="'vllm' extra"):
        check_version(None)
    with pytest.raises(VLLMUnavailableError, match=r"vLLM 0\.31\.1 is installed.*0\.32\.0"):
        check_version("0.31.1")
    check_version("0.32.0+cpu")


def test_core_package_never_imports_vllm() -> None:
    code = (
        "import sys, agentcache.cli, agentcache.runtime.engine, agentcache.session, "
        "agentcache.engines.vllm, agentcache.engines.vllm.backend, agentcache.engines.vllm.config, "
        "agentcache.engines.vllm.transfer, agentcache.bench.vllm.run, "
        "agentcache.bench.vllm.cli, agentcache.backends; "
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_session_backend_setting(tiny: LoadedModel) -> None:
    from agentcache.backends import create_engine
    from agentcache.session import AgentSession

    with pytest.raises(ValueError, match="unknown backend 'tgi'; known: embedded, vllm"):
        create_engine("tgi")
    session = AgentSession(Engine(tiny), strategy="pic")
    assert session.turn(_prompt("a")).stats.strategy == "pic"


def test_the_filler_keeps_a_bounded_set_of_strategies(tiny: LoadedModel, tmp_path: Path) -> None:
    """Strategy specs come with requests: the instances kept are the most recently used."""
    filler = SegmentFiller(tiny, FolderSegmentStore(tmp_path, MB), 4096, "pic")
    specs = [f"cacheblend:ratio=0.{i + 1}" for i in range(MAX_STRATEGIES + 3)]
    first = filler.strategy(specs[0])
    for spec in specs[1:]:
        filler.strategy(spec)
        filler.strategy(specs[0])  # kept: used last
    assert len(filler._strategies) == MAX_STRATEGIES
    assert filler.strategy(specs[0]) is first
    assert specs[1] not in filler._strategies


EXACT_PLAN = "pic:exact_prefix=true:selection=offset:ratio=1"  # recomputes every moved token


def _with_new_history(update: str) -> SegmentedPrompt:
    """`_prompt(update)` with a history segment no earlier turn stored, after the moved ones."""
    segments = list(_prompt(update).segments)
    new = Segment(SegmentKind.FIXED, "Then the user asked for a packing list for the trip. ", "h3")
    return SegmentedPrompt([*segments[:-1], new, segments[-1]])


def _stored_after(store: FolderSegmentStore, model: LoadedModel, p: TokenizedPrompt) -> list[str]:
    """The context each segment of `p` is stored under, in the prompt's order."""
    out = []
    for seg in p.segments:
        meta = store.meta(
            model.model_id, "bytes-v1", segment_content_id(seg.ids, seg.segment.scope)
        )
        assert meta is not None and meta.context_id is not None
        out.append(meta.context_id)
    return out


def _second_turn(
    tiny: LoadedModel, tmp_path: Path, strategy: str
) -> tuple[FolderSegmentStore, TokenizedPrompt, int | None]:
    """Turn 1 computed by 'vLLM' and saved; turn 2 (its history moved by a longer update, a
    new history segment after it) filled by the connector with `strategy`, then saved with
    the fill's boundary. Returns the store, turn 2's prompt and the boundary."""
    engine = Engine(tiny)
    store = FolderSegmentStore(tmp_path, 64 * MB)
    pages = _paged(tiny, blocks=40)
    p1 = engine.tokenize(_prompt("step 1"))
    blocks1 = list(range(20, 20 + -(-p1.num_tokens // BS)))
    _vllm_prefill(tiny, pages, list(p1.ids), blocks1)
    save_segments(store, tiny.model_id, "bytes-v1", pages, RequestSpec.from_prompt(p1, None),
                  p1.ids, blocks1)  # fmt: skip
    p2 = engine.tokenize(_with_new_history("step 2 " * 9))
    spec2 = RequestSpec.from_prompt(p2, strategy)
    blocks2 = list(range(-(-p2.num_tokens // BS)))
    filled = SegmentFiller(tiny, store, 4096, strategy).fill(
        pages, spec2, p2.ids, blocks2, 0, p2.num_tokens - 1
    )
    save_segments(store, tiny.model_id, "bytes-v1", pages, spec2, p2.ids, blocks2,
                  filled.inexact_from)  # fmt: skip
    return store, p2, filled.inexact_from


def test_a_segment_computed_after_approximate_kv_is_stored_marked_inexact(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    """As the embedded engine commits it: `pic` reused the moved history approximately, so
    the new history segment after it, computed over that K/V, is stored under its context
    marked inexact; the changed update before the moved history, computed after exact K/V,
    is stored plain."""
    store, p2, inexact_from = _second_turn(tiny, tmp_path, "pic")
    state, h3 = p2.segments[1], p2.segments[4]
    assert inexact_from is not None and state.end <= inexact_from < h3.end
    contexts = context_ids(p2)
    stored = _stored_after(store, tiny, p2)
    assert stored[4] == inexact_context(contexts[4])  # h3: new, after the moved history
    assert stored[1] == contexts[1]  # the update: new, after the system prompt only


def test_a_fill_that_recomputes_every_moved_token_stores_plain_contexts(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    store, p2, inexact_from = _second_turn(tiny, tmp_path, EXACT_PLAN)
    assert inexact_from is None
    contexts = context_ids(p2)
    assert _stored_after(store, tiny, p2)[4] == contexts[4]


def test_the_store_says_where_a_staged_prefill_stops_being_exact(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    """A staged prefill's earlier stages load stored copies through vLLM's prefix cache: a
    stored segment computed after other tokens than it follows now starts the inexact part."""
    engine = Engine(tiny)
    store = FolderSegmentStore(tmp_path, 64 * MB)
    pages = _paged(tiny, blocks=40)
    p1 = engine.tokenize(_prompt("step 1"))
    blocks1 = list(range(-(-p1.num_tokens // BS)))
    _vllm_prefill(tiny, pages, list(p1.ids), blocks1)
    spec1 = RequestSpec.from_prompt(p1, None)
    save_segments(store, tiny.model_id, "bytes-v1", pages, spec1, p1.ids, blocks1)
    assert stored_inexact_from(store, tiny.model_id, "bytes-v1", spec1, p1.ids) is None
    p2 = engine.tokenize(_with_new_history("step 2 " * 9))
    spec2 = RequestSpec.from_prompt(p2, "epic")
    h1 = p2.segments[2]
    assert stored_inexact_from(store, tiny.model_id, "bytes-v1", spec2, p2.ids) == h1.start
    # the last stage's save reads it: the new history segment is stored marked inexact
    blocks2 = list(range(20, 20 + -(-p2.num_tokens // BS)))
    _vllm_prefill(tiny, pages, list(p2.ids), blocks2)
    staged = StagedMode(StoreKeys(store, tiny.model_id, "bytes-v1"), lambda: None)  # type: ignore[arg-type,return-value]
    work = RequestWork("r", "staged", list(p2.ids), blocks2, spec2, None, True)
    assert staged.save(pages, work) == 2  # the new update and h3
    stored, contexts = _stored_after(store, tiny, p2), context_ids(p2)
    assert stored[4] == inexact_context(contexts[4]) and stored[1] == contexts[1]
