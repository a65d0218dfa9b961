"""Position plans: where each reused chunk's keys are placed (CCPE's decision, as policies).

    true : every token at its index in this prompt; cached keys re-rotated there
    mode : a reused segment at the start it was seen at most often in this session (ties:
           the earliest), so its keys may need no rotation; positions may then overlap
    ccpe : (CoPE models) reuse a chunk only where its encoding is the task's most frequent

The per-segment counts `mode` and `ccpe` keep are bounded: the least recently seen segments
are forgotten first (`BoundedCounts`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from typing import ClassVar

import torch
from torch import Tensor

from agentcache.kv.store import segment_content_id
from agentcache.model.llama import LlamaForward
from agentcache.prompt.tokenize import TokenizedPrompt, TokenizedSegment
from agentcache.registry import Registry
from agentcache.reuse.base import ReuseStats
from agentcache.reuse.segments import REUSABLE, SegmentHit

MAX_SEGMENTS = 4096  # segments whose counts a plan keeps


class BoundedCounts:
    """Per-key counters, at most `max_keys` keys; the least recently used key goes first."""

    def __init__(self, max_keys: int = MAX_SEGMENTS) -> None:
        self.max_keys = max_keys
        self._counts: OrderedDict[str, Counter[int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, key: str) -> Counter[int] | None:
        if key in self._counts:
            self._counts.move_to_end(key)
        return self._counts.get(key)

    def most_frequent(self, key: str) -> int | None:
        """The value counted most often under `key` (ties: the smallest), None if none."""
        counts = self.get(key)
        if not counts:
            return None
        return max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]

    def add(self, key: str, value: int) -> None:
        self._counts.setdefault(key, Counter())[value] += 1
        self._counts.move_to_end(key)
        while len(self._counts) > self.max_keys:
            self._counts.popitem(last=False)


def segment_key(seg: TokenizedSegment) -> str:
    """A plan's history key for a segment: its store key, scope included, so that what one
    conversation sends never moves another's positions."""
    return segment_content_id(seg.ids, seg.segment.scope)


class PositionPlan(ABC):
    """Positions for every prompt token given this turn's hits.

    Contract: `filter` may drop hits (counting each as a fallback in `stats`) and returns the
    hits to reuse; `positions` returns (T,) position ids. Both may record the turn in the
    plan's own bounded history; neither touches the store or the sequence."""

    name: ClassVar[str]

    def filter(
        self, forward: LlamaForward, model_id: str, prompt: TokenizedPrompt,
        hits: list[SegmentHit], stats: ReuseStats,
    ) -> list[SegmentHit]:  # fmt: skip
        return hits

    @abstractmethod
    def positions(self, prompt: TokenizedPrompt, hits: list[SegmentHit]) -> Tensor: ...


PLANS: Registry[PositionPlan] = Registry("position plan")


@PLANS.register("true")
class TruePositions(PositionPlan):
    name = "true"

    def positions(self, prompt: TokenizedPrompt, hits: list[SegmentHit]) -> Tensor:
        return torch.arange(prompt.num_tokens)


@PLANS.register("mode")
class ModeStart(PositionPlan):
    name = "mode"

    def __init__(self) -> None:
        self.starts = BoundedCounts()

    def positions(self, prompt: TokenizedPrompt, hits: list[SegmentHit]) -> Tensor:
        positions = torch.arange(prompt.num_tokens)
        for h in hits:
            start = self.starts.most_frequent(segment_key(h.segment))
            if start is not None:
                positions[h.start : h.end] = torch.arange(start, start + h.num_tokens)
        for seg in prompt.segments:
            if seg.kind in REUSABLE:
                self.starts.add(segment_key(seg), seg.start)
        return positions
