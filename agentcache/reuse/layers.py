"""Running tokens through the model layer by layer, as every reuse strategy does.

    hidden (T, D) --project(l)--> q, k, v --context(l, qkv)--> K/V (S, Hkv, Dh) --attend(l)-->
    hidden (T, D), for l in `layers`

`context` is the caller's: it writes what it keeps of the fresh k/v (replace, fuse, or not at
all) and returns the K/V the queries attend over. `TimedForward` times every model call, so a
prefill's overhead (what it spends besides computing tokens: lookup, loading, re-rotation,
assembling K/V, ranking) is its wall time less that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

from torch import Tensor

from agentcache.model.attention import AttentionSpec, causal_mask, masked_attention
from agentcache.model.config import ModelConfig
from agentcache.model.llama import QKV, LlamaForward
from agentcache.model.rope import LayerRotary


class ComputeClock(Protocol):
    """Where model-call time and count add up (`ReuseStats`)."""

    compute_s: float
    model_calls: int


P = ParamSpec("P")
R = TypeVar("R")

ContextKV = Callable[[int, QKV], tuple[Tensor, Tensor]]


class TimedForward:
    """`LlamaForward`'s layer API, adding the time of every call to `stats.compute_s` and
    counting it in `stats.model_calls`."""

    def __init__(self, forward: LlamaForward, stats: ComputeClock) -> None:
        self.inner = forward
        self.stats = stats
        self.config: ModelConfig = forward.config
        self.rotary: LayerRotary = forward.rotary
        self.spec: AttentionSpec = forward.spec
        self.scale = forward.scale

    def _timed(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.stats.compute_s += time.perf_counter() - t0
            self.stats.model_calls += 1

    def embed(self, ids: Tensor) -> Tensor:
        return self._timed(self.inner.embed, ids)

    def project(self, layer: int, hidden: Tensor, positions: Tensor) -> QKV:
        return self._timed(self.inner.project, layer, hidden, positions)

    def attend(
        self, layer: int, hidden: Tensor, q: Tensor, keys: Tensor, values: Tensor,
        query_index: Tensor | None,
    ) -> Tensor:  # fmt: skip
        return self._timed(self.inner.attend, layer, hidden, q, keys, values, query_index)

    def attend_masked(
        self, layer: int, hidden: Tensor, q: Tensor, keys: Tensor, values: Tensor,
        query_index: Tensor, key_index: Tensor,
    ) -> Tensor:  # fmt: skip
        """`attend` over a context that is a subset of the prompt: `query_index` (T,) and
        `key_index` (S,) are prompt indices, so the layer's window counts prompt tokens."""
        mask = causal_mask(query_index, len(key_index), self.spec.window(layer), key_index)
        return self._timed(self._attend_masked, layer, hidden, q, keys, values, mask)

    def _attend_masked(
        self, layer: int, hidden: Tensor, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor
    ) -> Tensor:
        attn = masked_attention(q, keys, values, mask, self.scale)
        return self.inner.finish(layer, hidden, attn)

    def logits(self, hidden: Tensor) -> Tensor:
        return self._timed(self.inner.logits, hidden)


def run_layers(
    f: TimedForward,
    layers: range,
    hidden: Tensor,
    positions: Tensor,
    query_index: Tensor | None,
    context: ContextKV,
) -> Tensor:
    """Carry `hidden` (T, D) through `layers` at `positions` (T,); queries see context keys
    0..query_index (None: the T tokens are the context's last T, causally). -> (T, D)"""
    for layer in layers:
        qkv = f.project(layer, hidden, positions)
        keys, values = context(layer, qkv)
        hidden = f.attend(layer, hidden, qkv.q, keys, values, query_index)
    return hidden
