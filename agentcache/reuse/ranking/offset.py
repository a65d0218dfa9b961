"""EPIC's order: by offset within the chunk, chunk starts first, chosen before any layer runs.

    chunks : [ A........ ][ B.... ][ C.......... ]
    order  :   A0 B0 C0 A1 B1 C1 A2 ...   (earlier chunks first at equal offset)

`offset` counts from every reused segment's start (EPIC); `span-offset` from the start of
every span of reused segments stored together and adjacent again (`runs.chunk_spans`):
inside a span no token's local context changed, so offsets grow from where it did change.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from agentcache.reuse.ranking.base import RANKERS, RankingView, TokenRanker
from agentcache.reuse.runs import chunk_spans


def offset_order(spans: list[tuple[int, int]], candidates: Tensor) -> Tensor:
    """Sort key of every token (T,): offset in its chunk, then index; -1 outside chunks."""
    n = len(candidates)
    offset = torch.full(candidates.shape, -1, dtype=torch.int64)
    for start, end in spans:
        offset[start:end] = torch.arange(end - start)
    return torch.where(offset >= 0, offset * (n + 1) + torch.arange(n), -1)


def by_offset(spans: list[tuple[int, int]], candidates: Tensor, budget: int) -> Tensor:
    """`budget` candidates in offset order (T,) bool: the reference the ranker agrees with."""
    key = offset_order(spans, candidates)
    idx = (candidates & (key >= 0)).nonzero().flatten()
    chosen = torch.zeros_like(candidates)
    chosen[idx[torch.argsort(key[idx])[:budget]]] = True
    return chosen


@RANKERS.register("offset")
class ChunkOffset(TokenRanker):
    name = "offset"
    up_front = True
    merge_spans: ClassVar[bool] = False

    def scores(self, view: RankingView) -> Tensor:
        mask = torch.zeros(view.num_tokens, dtype=torch.bool)
        mask[view.candidates] = True
        key = offset_order(chunk_spans(view.runs, self.merge_spans), mask)[view.candidates]
        # lowest key first; a candidate outside every chunk (none are, by construction) last
        return torch.where(key >= 0, -key, -((len(mask) + 1) ** 2)).to(torch.float64)


@RANKERS.register("span-offset")
class SpanOffset(ChunkOffset):
    name = "span-offset"
    merge_spans = True
