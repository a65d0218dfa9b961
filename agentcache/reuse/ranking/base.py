"""The ranking seam: which reused tokens a prefill recomputes first.

A ranker only scores; the pass that gathered its evidence picks the top of the budget.

    up front    : before any layer runs, from where tokens sit (`view.runs`)   offset, span
    check pass  : layers before `check_layer` for every non-exact token, then at it the key
                  deviation and the attention the always-computed tokens pay   deviation, ...
    probe pass  : the always-computed tokens through the first `probe_layers` layers; the
                  attention the last `window` of them pay                      attention, random
    own probe   : the ranker runs the model itself through `view.prefill`      query
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from torch import Tensor

from agentcache.registry import Registry
from agentcache.reuse.runs import ReusedRun

if TYPE_CHECKING:
    from agentcache.reuse.base import ReuseStats
    from agentcache.reuse.layers import TimedForward
    from agentcache.tiers.overlay import DirectKV

DEVIATION, ATTENTION, MODEL = "deviation", "attention", "model"


@dataclass(frozen=True)
class RankerConfig:
    seed: int = 0  # for rankers that draw
    window: int = 32  # last always-computed tokens whose attention ranks (probe_window)


class PrefillAccess(Protocol):
    """What a ranker running its own probe may use of the prefill in progress."""

    f: TimedForward
    kv: DirectKV  # cached K/V loaded and re-rotated; the ranker must not write it
    ids: Tensor  # (T,)
    positions: Tensor  # (T,) planned positions
    stats: ReuseStats  # token-layers the ranker computes are counted here


@dataclass(frozen=True)
class RankingView:
    """The evidence a ranker may read; what its class does not declare in `reads` is None."""

    candidates: Tensor  # (n,) prompt indices the budget is spent on, sorted
    num_tokens: int
    runs: list[ReusedRun]
    base: Tensor  # (T,) bool: tokens computed through every layer anyway
    deviation: Tensor | None = None  # (n,) ||K fresh - K cached||^2 at the check layer
    attention: Tensor | None = None  # (T,) attention the always-computed tokens pay
    prefill: PrefillAccess | None = None


class TokenRanker(ABC):
    """Scores candidate tokens for recompute; higher first.

    Contract:
    - `scores(view)` returns one finite score per `view.candidates` entry (n,); it reads only
      the evidence its class lists in `reads` (plus `candidates`, `num_tokens`, `runs`,
      `base`), mutates nothing but `view.prefill.stats`, and returns a new tensor.
    - `up_front` rankers read no pass at all: their scores follow from where tokens sit, so
      the tokens a prefill computes are known before any layer runs (a vLLM staged prefill
      can run them).
    - The same view and config give the same scores (seeded where it draws).
    """

    name: ClassVar[str]
    up_front: ClassVar[bool] = False
    reads: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: RankerConfig) -> None:
        self.config = config

    @abstractmethod
    def scores(self, view: RankingView) -> Tensor: ...

    @classmethod
    def passes(cls) -> tuple[str, ...]:
        """The evidence passes this ranker can read: "check", "probe" or "own"."""
        if cls.up_front:
            return ()
        if MODEL in cls.reads:
            return ("own",)
        return ("check",) if DEVIATION in cls.reads else ("check", "probe")


RANKERS: Registry[TokenRanker] = Registry("token ranker")
