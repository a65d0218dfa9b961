"""Eviction order for the segment store."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict

from agentcache.registry import Registry

EVICTION_POLICIES: Registry[EvictionPolicy] = Registry("eviction policy")


class EvictionPolicy(ABC):
    """Chooses which stored entry to drop next.

    The store reports every insert, access and removal; the policy only orders keys and never
    touches the store. `victim()` returns a key currently tracked, or None when none is; it does
    not remove the key (the store calls `on_remove` once the entry is gone).
    """

    @abstractmethod
    def on_insert(self, key: str, nbytes: int) -> None: ...

    @abstractmethod
    def on_access(self, key: str) -> None: ...

    @abstractmethod
    def on_remove(self, key: str) -> None: ...

    @abstractmethod
    def victim(self) -> str | None: ...


@EVICTION_POLICIES.register("lru")
class LRUPolicy(EvictionPolicy):
    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def on_insert(self, key: str, nbytes: int) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_access(self, key: str) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: str) -> None:
        self._order.pop(key, None)

    def victim(self) -> str | None:
        return next(iter(self._order), None)


@EVICTION_POLICIES.register("fifo")
class FIFOPolicy(LRUPolicy):
    def on_access(self, key: str) -> None:
        pass
