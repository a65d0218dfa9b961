"""Contract suite over every registered decode policy."""

from __future__ import annotations

import pytest
import torch

from agentcache.decode.policies import DECODE_POLICIES
from agentcache.decode.profile import HeadProfile
from agentcache.errors import UnknownStrategyError

L, H = 5, 4


def profile() -> HeadProfile:
    torch.manual_seed(0)
    stability = torch.rand(L, H).tolist()
    return HeadProfile("m#1", L, H, stability, [(0, 0), (3, 2), (4, 1), (1, 3), (2, 2)])


@pytest.mark.parametrize("name", DECODE_POLICIES.names())
def test_plan_contract(name: str) -> None:
    policy = DECODE_POLICIES.get(name)()
    prof = profile()
    before = prof.to_json()
    plan = policy.plan(L, H, prof if policy.needs_profile else None)
    assert prof.to_json() == before  # plan mutates nothing
    assert plan.rerank_interval.shape == plan.offload.shape == (L, H)
    assert plan.rerank_interval.dtype == torch.int64 and plan.offload.dtype == torch.bool
    assert bool((plan.rerank_interval >= 1).all())
    assert not bool((plan.offload & (plan.rerank_interval == 1)).any())
    if not plan.sparse:
        assert not bool(plan.offload.any())
    if policy.needs_profile:
        unstable = prof.unstable_mask()
        assert bool((plan.rerank_interval[unstable] == 1).all())  # unstable heads: every step
        assert not bool(plan.offload[unstable].any())  # and full KV in the fast tier
        assert bool(plan.offload[~unstable].all())
    if plan.streaming is not None:  # streaming heads: stable, offloaded, a window of pages
        assert plan.streaming.shape == (L, H) and plan.streaming.dtype == torch.bool
        assert not bool((plan.streaming & ~plan.offload).any()) and plan.window_pages >= 1


def test_flexicache_stable_heads_rerank_every_16_steps() -> None:
    plan = DECODE_POLICIES.get("flexicache")().plan(L, H, profile())
    assert sorted(set(plan.rerank_interval.flatten().tolist())) == [1, 16]
    assert int(plan.offload.sum()) == L * H - 5


def test_multiscale_interval_grows_with_stability() -> None:
    prof = profile()
    plan = DECODE_POLICIES.get("multiscale")(quantiles=(0.25, 0.5)).plan(L, H, prof)
    s = prof.stability_tensor()
    stable = ~prof.unstable_mask()
    iv = plan.rerank_interval
    order = s[stable].argsort()
    by_rank = iv[stable][order].tolist()  # intervals of the stable heads, least stable first
    assert by_rank == sorted(by_rank) and set(by_rank) == {4, 16, 64}
    assert sorted(set(iv[~stable].tolist())) == [1]


@pytest.mark.parametrize(("interval", "offloaded"), [(1, 0), (2, L * H), (16, L * H)])
def test_quest_with_an_interval_offloads_every_head(interval: int, offloaded: int) -> None:
    plan = DECODE_POLICIES.get("quest")(interval=interval).plan(L, H, None)
    assert plan.sparse and sorted(set(plan.rerank_interval.flatten().tolist())) == [interval]
    assert int(plan.offload.sum()) == offloaded and plan.streaming is None


@pytest.mark.parametrize("interval", [0, -3, 2.5, True])
def test_quest_rejects_a_bad_interval(interval: int) -> None:
    needle = f"quest option interval must be >= 1 step, got {interval!r}"
    with pytest.raises(ValueError, match=needle):
        DECODE_POLICIES.get("quest")(interval=interval)


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownStrategyError, match="flexicache"):
        DECODE_POLICIES.get("nope")


@pytest.mark.parametrize("kw", [{"stable_interval": 0}])
def test_flexicache_rejects_bad_interval(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        DECODE_POLICIES.get("flexicache")(**kw)


def test_multiscale_rejects_unordered_thresholds() -> None:
    with pytest.raises(ValueError):
        DECODE_POLICIES.get("multiscale")(quantiles=(0.9, 0.1))


@pytest.mark.parametrize(("fraction", "count"), [(0.0, 0), (0.5, 8), (1.0, 15)])
def test_streaming_heads_are_the_most_stable_of_the_stable_heads(
    fraction: float, count: int
) -> None:
    prof = profile()
    plan = DECODE_POLICIES.get("streaming")(fraction=fraction, window=8).plan(L, H, prof)
    assert plan.streaming is not None and plan.window_pages == 8
    s, stable = prof.stability_tensor(), ~prof.unstable_mask()
    assert int(plan.streaming.sum()) == count and not bool((plan.streaming & ~stable).any())
    if 0 < count < 15:
        assert float(s[plan.streaming].min()) > float(s[stable & ~plan.streaming].max())
    flexi = DECODE_POLICIES.get("flexicache")().plan(L, H, prof)
    assert torch.equal(plan.offload, flexi.offload)  # the other heads are flexicache's


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"window": 0}, "window must be >= 1 page"), ({"fraction": 1.01}, "fraction"),
     ({"fraction": -0.5}, "fraction")],
)  # fmt: skip
def test_streaming_rejects_bad_options(kw: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        DECODE_POLICIES.get("streaming")(**kw)
