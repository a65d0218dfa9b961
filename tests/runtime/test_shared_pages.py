"""Running turns with a common opening hold its pages once (EngineConfig.share_pages,
kv/shared.py): each turn's output is what it is alone and without sharing, a pool that holds
two turns' own pages runs more of them at once, and no scope shares with another."""

from __future__ import annotations

import pytest

from agentcache.errors import ConfigError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.server.metrics import pool_pages
from tests.conftest import at_once

DOC = "".join(f"line {i}: the build step {i * 7 % 13} wrote report-{i}.txt\n" for i in range(12))
N = 6
PARAMS = GenerationParams(max_new_tokens=8)


def ask(i: int, scope: str | None = None) -> SegmentedPrompt:
    return SegmentedPrompt([
        Segment(SegmentKind.SYSTEM, "You read the document and answer.", "sys", "system", scope),
        Segment(SegmentKind.FIXED, DOC, "doc", "user", scope),
        Segment(SegmentKind.UPDATE, f"question {i}: which report is {i}?" + "?" * i, "q", "user",
                scope),
    ])  # fmt: skip


STRATEGIES = ["prefix", "full", "prefix", "rpdc", "prefix", "prefix"]


def engine(model: LoadedModel, share: bool, kv_pages: int = 512, batch: bool = True) -> Engine:
    return Engine(model, EngineConfig(kv_pages=kv_pages, batch_decode=batch, share_pages=share))


def turns(e: Engine, scope: str | None = None) -> list[Generation]:
    """The document stored by a first turn, then N turns reading it at once."""
    e.generate(ask(99, scope), PARAMS, "prefix")
    return at_once(lambda i: e.generate(ask(i, scope), PARAMS, STRATEGIES[i], commit=False), N)


@pytest.mark.parametrize("batch", [True, False])
def test_turns_sharing_pages_give_the_outputs_of_turns_that_do_not(
    tiny: LoadedModel, batch: bool
) -> None:
    shared = engine(tiny, True, batch=batch)
    together = turns(shared)
    apart = turns(engine(tiny, False, batch=batch))
    for s, a in zip(together, apart, strict=True):
        assert s.token_ids == a.token_ids
        assert a.stats.shared_pages == 0
    assert sum(g.stats.shared_pages for g in together) > 0
    assert shared.shared is not None and shared.shared.shared > 0
    alone = engine(tiny, True, batch=batch)
    alone.generate(ask(99), PARAMS, "prefix")
    for i, s in enumerate(together):
        one = alone.generate(ask(i), PARAMS, STRATEGIES[i], commit=False)
        assert one.token_ids == s.token_ids
        assert one.stats.shared_pages == 0  # nothing else running: nothing to share
    # every page comes back when the turns end: nothing stays registered
    assert shared.ctx.pool.num_used == 0 and len(shared.shared) == 0


def test_a_pool_of_two_turns_runs_more_when_they_share(tiny: LoadedModel) -> None:
    """The pool holds two turns' own pages: sharing the document's lets more run at once."""
    e = engine(tiny, False)
    pages = e._pages_for(e.tokenize(ask(N - 1)), PARAMS)
    kv_pages = 2 * pages + pages // 2
    apart = engine(tiny, False, kv_pages=kv_pages)
    together = engine(tiny, True, kv_pages=kv_pages)
    a, s = turns(apart), turns(together)
    assert [g.token_ids for g in a] == [g.token_ids for g in s]
    assert apart.gate.peak_running <= 2
    assert together.gate.peak_running > apart.gate.peak_running


def test_no_scope_shares_with_another(tiny: LoadedModel) -> None:
    """Two scopes (two tenants' cache salts) hold the same document, the same K/V bits: a turn
    shares pages with a running turn of its own scope only."""
    e = engine(tiny, True)
    for scope in ("tenant-a", "tenant-b"):
        e.generate(ask(99, scope), PARAMS, "prefix")
    held = {}
    for name, scope in (("a1", "tenant-a"), ("b1", "tenant-b"), ("a2", "tenant-a")):
        tokens = e.tokenize(ask(0, scope))
        seq, _ = e.prefill(tokens, "prefix")
        held[name] = (seq, e._share(tokens, seq))
    (a1, _), (b1, shared_b), (a2, shared_a) = held["a1"], held["b1"], held["a2"]
    assert shared_b == 0 and set(b1.table.pages).isdisjoint(a1.table.pages)
    assert shared_a > 0 and a2.table.pages[:shared_a] == a1.table.pages[:shared_a]
    pages = pool_pages(e)  # what /metrics shows of the pool
    assert pages is not None and pages["shared"] == shared_a
    assert pages["used"] + pages["free"] == pages["capacity"] == e.ctx.pool.config.num_pages
    # the same bits: without the scope in the chain, b1 would have shared a1's pages
    b_keys, a_keys = b1.gather_all(slice(0, 16))[0], a1.gather_all(slice(0, 16))[0]
    assert bool((b_keys == a_keys).all())
    for seq, _ in held.values():
        seq.free()
    assert e.ctx.pool.num_used == 0


def test_share_pages_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="share_pages"):
        EngineConfig(share_pages="yes")  # type: ignore[arg-type]


def test_a_compare_that_fails_drops_its_pins(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pages pinned for the compare outside the lock are let go whatever happens there:
    the error reaches the caller, the turn keeps its own pages, every reference comes back."""
    e = engine(tiny, True, batch=False)
    assert e.shared is not None
    e.generate(ask(99), PARAMS, "prefix")
    tokens = e.tokenize(ask(0))
    first, _ = e.prefill(tokens, "prefix")
    e._share(tokens, first)
    second, _ = e.prefill(tokens, "prefix")
    own = list(second.table.pages)

    def broken(*_: object) -> list[bool]:
        raise RuntimeError("the compare broke")

    monkeypatch.setattr(e.shared, "equal", broken)
    with pytest.raises(RuntimeError, match="compare broke"):
        e._share(tokens, second)
    assert second.table.pages == own
    assert all(e.ctx.pool.refcount(p) == 1 for p in first.table.pages)
    first.free()
    second.free()
    assert e.ctx.pool.num_used == 0
