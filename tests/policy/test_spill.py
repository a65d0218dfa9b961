"""Contract suite over every registered spill policy, then each policy's exact order."""

from __future__ import annotations

import random

import pytest

from agentcache.policy.spill import SPILL_POLICIES, PageInfo, SpillPolicy

P = 100  # bytes of one page


def info(key: str, dirty: int, use: int, seg: str = "s", index: int = 0) -> PageInfo:
    return PageInfo(key, seg, index, P, dirty, dirty == 0, use)


def pages_random(seed: int, n: int = 30) -> list[PageInfo]:
    rng = random.Random(seed)
    return [
        info(f"p{i}", rng.choice([0, 0, 1, 3, 16]), rng.randrange(1000), f"s{i % 4}", i // 4)
        for i in range(n)
    ]


@pytest.fixture(params=SPILL_POLICIES.names())
def policy(request: pytest.FixtureRequest) -> SpillPolicy:
    return SPILL_POLICIES.get(request.param)()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("need", [1, 250, 1000, 10_000])
def test_contract(policy: SpillPolicy, seed: int, need: int) -> None:
    pages = pages_random(seed)
    by_key = {p.key: p for p in pages}
    plan = policy.plan(pages, need)
    keys = plan.keys
    assert len(keys) == len(set(keys)) and set(keys) <= set(by_key)
    assert all(by_key[k].clean for k in plan.drops)
    assert all(len(e) > 0 for e in plan.extents)
    dirty = {p.key for p in pages if not p.clean}
    written = {k for e in plan.extents for k in e}
    assert {k for k in keys if k in dirty} <= written  # a dirty victim is always written
    freed = sum(by_key[k].nbytes for k in keys)
    assert freed >= min(need, len(pages) * P)


def test_zero_need_is_empty(policy: SpillPolicy) -> None:
    plan = policy.plan(pages_random(0), 0)
    assert plan.keys == []


def test_slide_clean_first_then_dirty_count_desc_in_merged_extents() -> None:
    pages = [
        info("c-old", 0, 1), info("c-new", 0, 9),
        info("d1", 1, 0, "a", 0), info("d16", 16, 5, "b", 1), info("d3", 3, 2, "b", 0),
    ]  # fmt: skip
    plan = SPILL_POLICIES.get("slide")().plan(pages, 4 * P)
    assert plan.drops == ("c-old", "c-new")
    assert plan.extents == (("d3", "d16"),)  # the two most dirty, merged, in segment order
    plan = SPILL_POLICIES.get("slide")(max_extent_pages=1).plan(pages, 5 * P)
    assert plan.extents == (("d1",), ("d3",), ("d16",))


def test_lru_oldest_first_page_at_a_time_and_rewrites_clean_pages() -> None:
    pages = [info("a", 0, 3), info("b", 5, 1), info("c", 0, 2), info("d", 2, 4)]
    plan = SPILL_POLICIES.get("lru")().plan(pages, 3 * P)
    assert plan.drops == ()
    assert plan.extents == (("b",), ("c",), ("a",))


def test_lru_clean_drops_clean_pages_in_lru_order() -> None:
    pages = [info("a", 0, 3), info("b", 5, 1), info("c", 0, 2), info("d", 2, 4)]
    plan = SPILL_POLICIES.get("lru-clean")().plan(pages, 3 * P)
    assert plan.drops == ("c", "a")
    assert plan.extents == (("b",),)


def test_unknown_policy_lists_known() -> None:
    from agentcache.errors import UnknownStrategyError

    with pytest.raises(UnknownStrategyError, match="slide"):
        SPILL_POLICIES.get("nope")


def test_only_slide_writes_deltas_and_the_option_is_checked() -> None:
    assert SPILL_POLICIES.get("slide")().deltas is True
    assert SPILL_POLICIES.get("slide")(deltas=False).deltas is False
    assert SPILL_POLICIES.get("lru")().deltas is False  # no dirty bits: whole pages
    assert SPILL_POLICIES.get("lru-clean")().deltas is False
    with pytest.raises(ValueError, match="deltas must be true or false"):
        SPILL_POLICIES.get("slide")(deltas="yes")
