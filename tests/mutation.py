"""Where a mutation test changes a JSON value: a place picked at random, and the operation."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any


def paths(x: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    children = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in children:
        yield from paths(v, (*path, k))


def at(x: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        x = x[p]
    return x


def pick(x: Any, rng: random.Random) -> tuple[Any, Any, float]:
    """A place below the root of `x`, as (its parent, its key or index), and a number in
    [0, 1) that chooses what is done there."""
    path = rng.choice(list(paths(x))[1:])
    return at(x, path[:-1]), path[-1], rng.random()
