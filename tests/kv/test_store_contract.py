"""The `SegmentStore` contract (agentcache/kv/store.py), run over every store: the memory
store, the tiered store with a memory tier only and with a disk tier, and the vLLM folder
store (plain torch and files: it needs no vLLM). A new store joins `STORES`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.kv.memory_store import MemorySegmentStore
from agentcache.kv.store import (
    MissReason,
    SegmentStore,
    StoredKV,
    segment_content_id,
)
from agentcache.prompt.segments import Segment, SegmentKind
from agentcache.prompt.tokenize import TokenizedSegment
from agentcache.tiers.base import PageData
from agentcache.tiers.config import TierConfig
from agentcache.tiers.store import TieredSegmentStore
from agentcache.tiers.versions import adopt_recomputed

M, T = "model-a", "tok-1"
TOKENS = 8  # tokens of one entry: two pages of PAGE_SIZE
PAGE_SIZE = 4
ENTRY = 2 * TOKENS * 4 * 4  # bytes of one entry: K and V, 1 layer x 8 tokens x 1 head x dim 4
CAPACITY = 4 * ENTRY

Make = Callable[[int], SegmentStore]


def entry(fill: float = 1.0, model: str = M, context: str | None = "ctx") -> StoredKV:
    """Token i of the entry holds fill + i in K and -(fill + i) in V."""
    keys = (
        (fill + torch.arange(TOKENS, dtype=torch.float32))
        .view(1, TOKENS, 1, 1)
        .expand(1, TOKENS, 1, 4)
    )
    keys = keys.contiguous()
    return StoredKV(keys, -keys, torch.arange(10, 10 + TOKENS), model, T, context)


def cid(n: int, scope: str | None = None) -> str:
    return segment_content_id(tuple(range(100 * n, 100 * n + TOKENS)), scope)


def same(a: StoredKV | None, b: StoredKV) -> bool:
    return (
        a is not None
        and all(
            torch.equal(x, y)
            for x, y in ((a.keys, b.keys), (a.values, b.values), (a.positions, b.positions))
        )
        and (a.model_id, a.tokenizer_id, a.context_id) == (b.model_id, b.tokenizer_id, b.context_id)
    )


def _tiered(tmp: Path | None) -> Callable[[int], TieredSegmentStore]:
    def make(capacity: int) -> TieredSegmentStore:
        if tmp is None:
            return TieredSegmentStore(TierConfig(fast_bytes=capacity, page_size=PAGE_SIZE))
        config = TierConfig(fast_bytes=capacity // 2, disk_dir=tmp, disk_bytes=capacity,
                            page_size=PAGE_SIZE, fsync=False)  # fmt: skip
        return TieredSegmentStore(config)

    return make


STORES = ["memory", "tiered-memory", "tiered-disk", "folder"]
BOUNDED = ["memory", "tiered-memory", "tiered-disk"]  # the folder keeps what memory evicts
TIERED = ["tiered-memory", "tiered-disk"]


def _factory(kind: str, tmp_path: Path, made: list[SegmentStore]) -> Make:
    def make(capacity: int) -> SegmentStore:
        folder = tmp_path / f"{kind}-{len(made)}"
        store: SegmentStore
        if kind == "memory":
            store = MemorySegmentStore(capacity)
        elif kind == "tiered-memory":
            store = _tiered(None)(capacity)
        elif kind == "tiered-disk":
            store = _tiered(folder)(capacity)
        else:
            store = FolderSegmentStore(folder, capacity)
        made.append(store)
        return store

    return make


@pytest.fixture
def made() -> Iterator[list[SegmentStore]]:
    stores: list[SegmentStore] = []
    yield stores
    for s in stores:
        if isinstance(s, TieredSegmentStore):
            s.close()


@pytest.fixture(params=STORES)
def make(request: pytest.FixtureRequest, tmp_path: Path, made: list[SegmentStore]) -> Make:
    return _factory(request.param, tmp_path, made)


@pytest.fixture(params=BOUNDED)
def make_bounded(request: pytest.FixtureRequest, tmp_path: Path, made: list[SegmentStore]) -> Make:
    return _factory(request.param, tmp_path, made)


@pytest.fixture(params=TIERED)
def make_tiered(request: pytest.FixtureRequest, tmp_path: Path, made: list[SegmentStore]) -> Make:
    return _factory(request.param, tmp_path, made)


def test_put_then_lookup_round_trips(make: Make) -> None:
    store = make(CAPACITY)
    assert store.put_content(cid(1), entry(3.0)) is True
    found = store.lookup_content(M, T, cid(1))
    assert found.hit and found.miss is None
    assert same(found.kv, entry(3.0))
    assert store.contains_content(M, T, cid(1)) and not store.contains_content(M, T, cid(2))


def test_token_ids_and_content_ids_name_the_same_entry(make: Make) -> None:
    store = make(CAPACITY)
    ids = list(range(5, 5 + TOKENS))
    assert store.put(ids, entry(2.0))
    assert same(store.lookup_content(M, T, segment_content_id(ids)).kv, entry(2.0))
    assert store.lookup(M, T, ids, namespace="fixed").miss is MissReason.NEW


def test_an_absent_key_misses_as_new_and_another_model_as_other_model(make: Make) -> None:
    store = make(CAPACITY)
    assert store.lookup_content(M, T, cid(1)).miss is MissReason.NEW
    store.put_content(cid(1), entry())
    assert store.lookup_content("model-b", T, cid(1)).miss is MissReason.OTHER_MODEL
    assert store.lookup_content(M, "tok-2", cid(1)).miss is MissReason.OTHER_MODEL
    assert store.lookup_content(M, T, cid(2)).miss is MissReason.NEW
    assert (store.stats.hits, store.stats.misses) == (0, 4)


def test_counters_move_as_documented(make: Make) -> None:
    store = make(CAPACITY)
    assert store.put_content(cid(1), entry()) and store.put_content(cid(2), entry(2.0))
    s = store.stats
    assert (s.entries, s.bytes, s.peak_bytes) == (2, 2 * ENTRY, 2 * ENTRY)
    assert (s.evictions, s.rejected) == (0, 0)
    before = asdict(store.stats)
    assert store.put_content(cid(1), entry(9.0)) is True  # held: kept, not replaced
    assert store.contains_content(M, T, cid(1)) and not store.contains_content(M, T, cid(3))
    assert asdict(store.stats) == before  # presence checks and a held put move nothing
    assert same(store.lookup_content(M, T, cid(1)).kv, entry())
    store.lookup_content(M, T, cid(3))
    store.lookup_content(M, T, cid(2))
    assert (store.stats.hits, store.stats.misses) == (2, 1)
    huge = StoredKV(torch.zeros(1, 200, 1, 4), torch.zeros(1, 200, 1, 4), torch.arange(200), M, T)
    assert store.put_content(cid(4), huge) is False  # larger than the whole capacity
    assert store.stats.rejected == 1 and store.stats.entries == 2


def test_entries_dropped_for_space_miss_as_evicted_and_are_counted(make_bounded: Make) -> None:
    store = make_bounded(CAPACITY)
    puts = 0
    while store.stats.evictions < 2 and puts < 50:
        assert store.put_content(cid(puts), entry(float(puts)))
        puts += 1
    assert store.stats.evictions == 2
    assert store.stats.entries + store.stats.evictions == puts
    reasons = [store.lookup_content(M, T, cid(n)).miss for n in range(puts)]
    # a tiered store's lookups promote pages, which may evict more
    evicted = store.stats.evictions
    assert reasons.count(MissReason.EVICTED) == evicted and reasons.count(None) == puts - evicted
    assert set(reasons) <= {None, MissReason.EVICTED} and reasons[-1] is None


def test_stored_kv_is_never_changed_in_place(make: Make) -> None:
    """What a lookup returned keeps its values after later puts, evictions, a newer
    version of its pages and clear()."""
    store = make(CAPACITY)
    store.put_content(cid(1), entry(1.0))
    got = store.lookup_content(M, T, cid(1)).kv
    assert got is not None
    again = store.lookup_content(M, T, cid(1)).kv
    assert same(again, entry(1.0))
    if isinstance(store, TieredSegmentStore):  # a newer version of page 0's first slot
        new = entry(7.0)
        page = PageData(new.keys[:, :PAGE_SIZE], new.values[:, :PAGE_SIZE], new.positions[:4])
        assert store.update_pages(M, T, cid(1), {0: (page, 0b1)})
    for n in range(2, 12):  # past the capacity: entry 1 is evicted in bounded stores
        store.put_content(cid(n), entry(float(n)))
    store.clear()
    assert same(got, entry(1.0))


def test_the_same_tokens_under_two_scopes_are_two_entries(make: Make) -> None:
    store = make(CAPACITY)
    store.put_content(cid(1, "conv-a"), entry(1.0))
    assert store.lookup_content(M, T, cid(1, "conv-b")).miss is MissReason.NEW
    assert store.lookup_content(M, T, cid(1)).miss is MissReason.NEW
    store.put_content(cid(1, "conv-b"), entry(2.0))
    store.put_content(cid(1), entry(3.0))
    assert store.stats.entries == 3
    assert same(store.lookup_content(M, T, cid(1, "conv-a")).kv, entry(1.0))
    assert same(store.lookup_content(M, T, cid(1, "conv-b")).kv, entry(2.0))
    assert same(store.lookup_content(M, T, cid(1)).kv, entry(3.0))


def test_clear_forgets_every_entry_and_its_history(make: Make) -> None:
    """After clear() a lookup of anything stored before misses as in a fresh store (NEW),
    evicted entries too; clearing is not an eviction, and hits and misses keep counting."""
    store = make(CAPACITY)
    for n in range(8):  # bounded stores evict some
        store.put_content(cid(n), entry(float(n)))
    store.lookup_content(M, T, cid(7))
    before = asdict(store.stats)
    store.clear()
    s = store.stats
    assert (s.entries, s.bytes) == (0, 0)
    assert (s.hits, s.misses, s.evictions) == (before["hits"], before["misses"],
                                               before["evictions"])  # fmt: skip
    assert {store.lookup_content(M, T, cid(n)).miss for n in range(8)} == {MissReason.NEW}
    assert not store.contains_content(M, T, cid(7))
    assert store.put_content(cid(7), entry(5.0))
    assert same(store.lookup_content(M, T, cid(7)).kv, entry(5.0))


def test_concurrent_calls_count_every_lookup_once(make: Make) -> None:
    store = make(CAPACITY)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for n in range(20):
                store.put_content(cid(t * 100 + n % 6), entry(float(n % 6)))
                store.lookup_content(M, T, cid(t * 100 + (n * 5) % 6))
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.stats.hits + store.stats.misses == 4 * 20


class _Seq:
    """The one SequenceKV call the write-back makes: K/V of a span of the prompt."""

    def __init__(self, kv: StoredKV) -> None:
        self.kv = kv

    def gather_all(self, span: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.keys[:, span].clone(), self.kv.values[:, span].clone()


@pytest.mark.parametrize("scope", [None, "conv-a"])  # a server conversation's segments are scoped
def test_dirty_page_write_back_updates_the_scoped_entry(
    make_tiered: Make, scope: str | None
) -> None:
    """The write-back keys a segment as the strategies stored it (scope included): it
    updates that entry, and no other holding the same tokens; on a disk tier the new version
    is what persists."""
    store = make_tiered(CAPACITY)
    assert isinstance(store, TieredSegmentStore)
    ids = tuple(range(100, 100 + TOKENS))
    other = "conv-b" if scope is None else None  # the same tokens in another scope
    store.put_content(segment_content_id(ids, scope), entry(1.0))
    store.put_content(segment_content_id(ids, other), entry(1.0))
    if store.tiers[-1].durable:
        assert store.persist() > 0  # every page has a disk copy: clean
    seg = TokenizedSegment(Segment(SegmentKind.FIXED, "x", "mem", "user", scope), ids, 0)
    recomputed = entry(50.0)
    dirty = torch.zeros(TOKENS, dtype=torch.bool)
    dirty[[1, 6]] = True  # slot 1 of page 0, slot 2 of page 1
    model = SimpleNamespace(model_id=M, tokenizer=SimpleNamespace(tokenizer_id=T))
    seq = _Seq(recomputed)
    assert adopt_recomputed(store, model, [seg], seq, recomputed.positions, dirty) == 2
    if store.tiers[-1].durable:
        assert store.persist() == 2
        store.demote_all()  # what a lookup reads now comes from the disk tier
    want = entry(1.0)
    for t in (1, 6):
        want.keys[:, t], want.values[:, t] = recomputed.keys[:, t], recomputed.values[:, t]
    got = store.lookup_content(M, T, segment_content_id(ids, scope))
    assert got.kv is not None
    assert torch.equal(got.kv.keys, want.keys) and torch.equal(got.kv.values, want.values)
    untouched = store.lookup_content(M, T, segment_content_id(ids, other)).kv
    assert untouched is not None and torch.equal(untouched.keys, entry(1.0).keys)
