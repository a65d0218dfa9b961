"""One turn's generation settings, validated where they are made."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from agentcache.errors import ConfigError

SEEDS = (-(1 << 63), (1 << 64) - 1)  # the seeds torch.Generator.manual_seed takes


class TokenConstraint(Protocol):
    """Which tokens may come next in one reply (a grammar: structured outputs), or a watcher of
    each step's logits (logprobs). Its state is the reply's ids so far: `allowed` catches up on
    the ids it has not seen, so any loop can call `sampling.constrain(logits, constraint, ids)`
    before it samples, with nothing else to keep in step. One instance per reply."""

    def allowed(self, ids: Sequence[int], logits: Tensor) -> Tensor | None:
        """A bool mask (V,) of the tokens that may follow `ids`, given this step's logits (V,)
        (read, never changed); None: every token."""
        ...


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint: TokenConstraint | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"max_new_tokens must be an integer >= 0, got {n!r}")
        t = self.temperature
        if not isinstance(t, numbers.Real) or not (math.isfinite(t) and t >= 0.0):
            raise ConfigError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not isinstance(self.top_p, numbers.Real) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        seed = self.seed
        if seed is not None and not (
            isinstance(seed, numbers.Integral) and SEEDS[0] <= seed <= SEEDS[1]
        ):
            raise ConfigError(f"seed must be None or an integer in [-2**63, 2**64), got {seed!r}")
        stop = self.stop
        if isinstance(stop, str):  # one string is one stop string, as in OpenAI's API
            stop = (stop,)
        stop = tuple(stop) if isinstance(stop, Iterable) else (stop,)
        if not all(isinstance(s, str) and s for s in stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)


def turn_params(params: object, reply: object = None) -> GenerationParams:
    """A turn's `params` (None: the defaults) and `reply` checked before any work: a dict
    given for params, or a reply mapping that is no function, is a ConfigError naming it."""
    if reply is not None and not callable(reply):
        raise ConfigError(
            f"reply must be a function of the reply's text returning its Segment (or None), "
            f"got {type(reply).__name__}"
        )
    if params is None:
        return GenerationParams()
    if not isinstance(params, GenerationParams):
        raise ConfigError(
            f"params must be a GenerationParams, got {type(params).__name__} "
            "(GenerationParams(**options) makes one from a dict)"
        )
    return params
