"""Decode placement and rerank policies: small classes chosen by name.

A policy turns a head profile into a HeadPlan: how often each (layer, KV head) re-scores its
pages, whether its full KV lives in the host tier (only the selected pages resident in the
fast tier) or stays whole in the fast tier, and which heads are streaming heads (the sink and a
window of the newest pages, no page selection).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from agentcache.decode.profile import HeadProfile
from agentcache.registry import Registry


@dataclass(frozen=True)
class HeadPlan:
    sparse: bool  # False: the engine's dense decode
    rerank_interval: Tensor  # (L, Hkv) int64 >= 1, steps between page re-scorings
    offload: Tensor  # (L, Hkv) bool, full KV in the host tier, top-K pages in the fast tier
    # (L, Hkv) bool, None = no head: streaming heads attend the sink page and the newest
    # `window_pages` pages, are never scored nor reranked (their rerank_interval is not read)
    streaming: Tensor | None = None
    window_pages: int = 0


class DecodePolicy(ABC):
    """Contract: `plan` reads the profile (None only when `needs_profile` is False), mutates
    nothing and returns a HeadPlan of shape (num_layers, num_kv_heads) with every interval >= 1.
    A head that reranks every step never needs to be offloaded, and a dense plan offloads
    nothing. A constructor rejects a bad option with a ValueError naming it; `options` lists
    the ones a policy spec may set (`streaming:window=16`) with their types."""

    name: ClassVar[str]
    needs_profile: ClassVar[bool] = False
    options: ClassVar[dict[str, type[Any]]] = {}

    @abstractmethod
    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        """The per-head plan for a model of this shape."""


DECODE_POLICIES: Registry[DecodePolicy] = Registry("decode policy")


def _fill(num_layers: int, num_kv_heads: int, value: int) -> Tensor:
    return torch.full((num_layers, num_kv_heads), value, dtype=torch.int64)


@DECODE_POLICIES.register("dense")
class Dense(DecodePolicy):
    """Every head attends over every page; no metadata, no rerank."""

    name = "dense"

    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        off = torch.zeros(num_layers, num_kv_heads, dtype=torch.bool)
        return HeadPlan(False, _fill(num_layers, num_kv_heads, 1), off)


@DECODE_POLICIES.register("quest")
class Quest(DecodePolicy):
    """Top-K sparse attention over every head, no profile. `interval` 1 (the default): every
    head reranked every step, full KV in the fast tier, the baseline for rerank cost. Above 1:
    every head reranked every `interval` steps and offloaded (full KV in the host tier, sink +
    top-K + tail in the fast tier), FlexiCache's treatment of stable heads given to all of
    them: a smaller fast tier per turn than `flexicache`'s, for verified decoding, whose
    output is dense's whatever the plan (`quest:interval=16:verify=8`)."""

    name = "quest"
    options: ClassVar[dict[str, type[Any]]] = {"interval": int}

    def __init__(self, interval: int = 1) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"quest option interval must be >= 1 step, got {interval!r}")
        self.interval = interval

    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        off = torch.full((num_layers, num_kv_heads), self.interval > 1, dtype=torch.bool)
        return HeadPlan(True, _fill(num_layers, num_kv_heads, self.interval), off)


@DECODE_POLICIES.register("flexicache")
class FlexiCache(DecodePolicy):
    """Unstable heads: full KV resident, rerank every step. Stable heads: offloaded, rerank
    every `stable_interval` steps."""

    name = "flexicache"
    needs_profile = True

    def __init__(self, stable_interval: int = 16) -> None:
        if stable_interval < 1:
            raise ValueError("stable_interval must be >= 1")
        self.stable_interval = stable_interval

    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        assert profile is not None
        unstable = profile.unstable_mask()
        interval = _fill(num_layers, num_kv_heads, self.stable_interval)
        interval[unstable] = 1
        return HeadPlan(True, interval, ~unstable & (interval > 1))


@DECODE_POLICIES.register("multiscale")
class MultiScale(DecodePolicy):
    """Rerank interval per head from the continuous stability score (mean 16-step RCO): the
    unstable set reranks every step (full KV resident); the other heads are offloaded and rerank
    every 4, 16 or 64 steps by where their score falls among the stable heads' scores: below
    the `quantiles[0]` quantile every 4, from there to `quantiles[1]` every 16, above every 64.
    Rank-based, so the split carries over to models whose scores sit at another level."""

    name = "multiscale"
    needs_profile = True
    intervals = (4, 16, 64)

    def __init__(self, quantiles: tuple[float, float] = (1 / 3, 2 / 3)) -> None:
        lo, hi = quantiles
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"quantiles must satisfy 0 <= lo <= hi <= 1, got {quantiles}")
        self.quantiles = (lo, hi)

    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        assert profile is not None
        s = profile.stability_tensor()
        unstable = profile.unstable_mask()
        interval = _fill(num_layers, num_kv_heads, self.intervals[0])
        if bool((~unstable).any()):
            lo, hi = torch.quantile(s[~unstable], torch.tensor(self.quantiles, dtype=s.dtype))
            interval[s >= lo] = self.intervals[1]
            interval[s >= hi] = self.intervals[2]
        interval[unstable] = 1
        return HeadPlan(True, interval, interval > 1)


@DECODE_POLICIES.register("streaming")
class Streaming(DecodePolicy):
    """FlexiCache whose most stable heads are streaming heads: of the heads outside the
    unstable set, the `fraction` with the highest stability score (rounded) attend the sink page
    and the newest `window` pages only: no MinMax scoring, no rerank, offloaded with 1 + window
    fast-tier slots. The other heads are flexicache's."""

    name = "streaming"
    needs_profile = True
    options: ClassVar[dict[str, type[Any]]] = {"fraction": float, "window": int}

    def __init__(self, fraction: float = 0.5, window: int = 64, stable_interval: int = 16) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(
                f"streaming option fraction (of the stable heads) must be in [0, 1], got {fraction}"
            )
        if window < 1:
            raise ValueError(f"streaming option window must be >= 1 page, got {window}")
        self.fraction, self.window = fraction, window
        self.base = FlexiCache(stable_interval)

    def plan(self, num_layers: int, num_kv_heads: int, profile: HeadProfile | None) -> HeadPlan:
        assert profile is not None
        base = self.base.plan(num_layers, num_kv_heads, profile)
        stable = torch.nonzero(~profile.unstable_mask().flatten()).flatten()
        score = profile.stability_tensor().flatten()[stable]
        count = round(self.fraction * len(stable))
        chosen = stable[torch.argsort(score, descending=True, stable=True)[:count]]
        streaming = torch.zeros(num_layers * num_kv_heads, dtype=torch.bool)
        streaming[chosen] = True
        streaming = streaming.view(num_layers, num_kv_heads)
        return HeadPlan(True, base.rerank_interval, base.offload, streaming, self.window)
