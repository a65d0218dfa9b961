"""Name -> class registries for swappable strategies and policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from agentcache.errors import UnknownStrategyError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = cls
            return cls

        return deco

    def get(self, name: str) -> type[T]:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownStrategyError(self.kind, name, list(self._items)) from None

    def names(self) -> list[str]:
        return list(self._items)
