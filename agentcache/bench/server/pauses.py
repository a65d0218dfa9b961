"""Tool pauses between an agent's turns.

A pause is drawn from a log-normal distribution given by its median and the standard deviation
of its logarithm (`sigma`), capped at `max_s`: with median 2 s and sigma 1.0, about 1 pause in
40 exceeds 14 s and about 1 in 300 exceeds 30 s. Each session's draws come from a generator
seeded by the run's seed and the session's name alone, so a session gets the same pauses
whatever other sessions are selected, in whatever order, against every target.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class PauseModel:
    """Log-normal pauses: `median_s` > 0, `sigma` >= 0 (0: every pause is the median),
    capped at `max_s` >= 0."""

    median_s: float = 2.0
    sigma: float = 1.0
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.median_s > 0:
            raise ValueError(f"median_s must be > 0, got {self.median_s}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if self.max_s < 0:
            raise ValueError(f"max_s must be >= 0, got {self.max_s}")

    def draw(self, rng: random.Random) -> float:
        return min(self.max_s, rng.lognormvariate(math.log(self.median_s), self.sigma))

    def session_pauses(self, seed: int, session: str, turns: int) -> list[float]:
        """The pauses after each of a session's turns but the last (`turns - 1` of them)."""
        rng = random.Random(f"{seed}:{session}")
        return [self.draw(rng) for _ in range(max(0, turns - 1))]
