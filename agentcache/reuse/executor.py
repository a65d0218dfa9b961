"""The layer executor of selective recompute: every model call of a selective prefill.

    prompt : [ system ][ update (new length) ][ fixed A ][ fixed B ][ update ][last]
    cached :  reused                            reused     reused
    kv     :  cached keys re-rotated to the plan's positions (DirectKV / OverlayKV)
    layers :  the computed tokens (base + the ranking's picks) go through every layer, their
              fresh K/V replace (or, WCA, are fused into) cached; every query attends
              causally over all T tokens' K/V

It runs tokens (`through`), brings hidden states up without writing (`catch_up`), and writes
K/V (`write`, fusion included); the passes that gather a ranker's evidence (check.py,
probe.py) and the own-probe rankers drive it.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from agentcache.model.llama import QKV
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.reuse.base import ReuseContext, ReuseStats
from agentcache.reuse.layers import ContextKV, TimedForward, run_layers
from agentcache.reuse.wca import fuse
from agentcache.tiers.overlay import DirectKV


class LayerExecutor:
    """One layer-by-layer selective prefill over `kv` (cached K/V loaded, or landing)."""

    def __init__(
        self,
        ctx: ReuseContext,
        prompt: TokenizedPrompt,
        positions: Tensor,
        stats: ReuseStats,
        kv: DirectKV,
        wca: bool = False,
    ) -> None:
        self.f = TimedForward(ctx.model.forward, stats)
        self.ids = torch.tensor(prompt.ids, dtype=torch.int64)
        self.kv = kv  # every K/V write and read goes through it (decoupled or direct)
        self.positions = positions
        self.stats = stats
        self.wca = wca  # fuse the rows `write` is told to, instead of replacing them
        self.ever_computed = torch.zeros(prompt.num_tokens, dtype=torch.bool)
        self.dirty = torch.zeros(prompt.num_tokens, dtype=torch.bool)  # written at layer >= 1

    @property
    def num_layers(self) -> int:
        return self.f.config.num_layers

    def embed(self, idx: Tensor) -> Tensor:
        return self.f.embed(self.ids[idx])

    def logits(self, hidden: Tensor) -> Tensor:
        """First-token logits (V,) from the last computed row."""
        return self.f.logits(hidden[-1:])[0]

    def through(self, hidden: Tensor, idx: Tensor, first: int, last: int) -> Tensor:
        """Run tokens `idx` through layers [first, last), writing their fresh K/V."""

        def context(layer: int, qkv: QKV) -> tuple[Tensor, Tensor]:
            t0 = time.perf_counter()
            self.kv.write(layer, idx, qkv.k, qkv.v)
            kv = self.kv.gather(layer)
            self.stats.assemble_s += time.perf_counter() - t0
            return kv

        hidden = self._run(hidden, idx, range(first, last), context)
        self.ever_computed[idx] = True
        if last > 1:
            self.dirty[idx] = True
        return hidden

    def fused_through(self, hidden: Tensor, idx: Tensor, fused: Tensor, layers: range) -> Tensor:
        """`through`, with the rows of mask `fused` fused into cached K/V (WCA)."""

        def context(layer: int, qkv: QKV) -> tuple[Tensor, Tensor]:
            self.write(layer, idx, qkv.k, qkv.v, fused)
            return self.kv.gather(layer)

        return self._run(hidden, idx, layers, context)

    def catch_up(self, hidden: Tensor, idx: Tensor, first: int, last: int) -> Tensor:
        """Bring tokens' hidden states from layer `first` to `last`, leaving the (cached) K/V
        they have at those layers untouched."""
        return self._run(hidden, idx, range(first, last), lambda layer, _: self.kv.gather(layer))

    def write(self, layer: int, idx: Tensor, k: Tensor, v: Tensor, fused: Tensor) -> None:
        """Fresh K/V of `idx` replace cached, except rows of mask `fused` under WCA."""
        self.ever_computed[idx] = True
        if layer >= 1:
            self.dirty[idx] = True
        if self.wca and bool(fused.any()):
            k, v = fuse(self.kv, layer, idx, k, v, fused)
        self.kv.write(layer, idx, k, v)

    def attend(self, layer: int, hidden: Tensor, q: Tensor, idx: Tensor) -> Tensor:
        keys, values = self.kv.gather(layer)
        return self.f.attend(layer, hidden, q, keys, values, idx)

    def _run(
        self,
        hidden: Tensor,
        idx: Tensor,
        layers: range,
        context: ContextKV,
    ) -> Tensor:
        hidden = run_layers(self.f, layers, hidden, self.positions[idx], idx, context)
        self.stats.token_layers_computed += len(idx) * len(layers)
        return hidden

    def plain(self, idx: Tensor) -> Tensor:
        """Tokens `idx` through every layer: the prefill when the computed set is known."""
        return self.logits(self.through(self.embed(idx), idx, 0, self.num_layers))


def top(cand: Tensor, scores: Tensor, budget: int) -> Tensor:
    """The `budget` highest-scoring of `cand`, sorted by index."""
    return cand[scores.topk(min(budget, len(cand))).indices].sort().values
