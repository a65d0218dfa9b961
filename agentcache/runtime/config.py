"""The engine's configuration: reuse strategy, fast-tier pages, segment store, decode policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcache.decode.config import DecodeConfig
from agentcache.errors import ConfigError
from agentcache.fieldtypes import check_field_types
from agentcache.kv.preemption import PREEMPTION_POLICIES
from agentcache.policy.eviction import EVICTION_POLICIES
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.reuse.base import STRATEGIES
from agentcache.tiers.config import TierConfig
from agentcache.units import GiB

PREFILL_ORDERS = ("arrival", "shortest")


@dataclass(frozen=True)
class EngineConfig:
    strategy: str = DEFAULT_STRATEGY
    kv_pages: int = 2048  # fast-tier pages (16 tokens each) shared by running requests
    store_bytes: int = 4 * GiB  # segment store capacity
    eviction: str = "lru"
    page_size: int = 16
    strategy_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode policy (default dense)
    tiers: TierConfig | None = None  # None: one MemorySegmentStore of store_bytes
    # a reuse plan predicted to cost more than full recompute runs `full`'s prefill instead
    # (counted: TurnStats.guarded); False takes every plan as the strategy makes it
    cost_guard: bool = True
    # fast-tier KV bytes: when set, the pool is as many pages as this holds and kv_pages is
    # not read; either way pages take memory when first used (agentcache/kv/pool.py)
    kv_bytes: int | None = None
    # concurrent turns decode as one batch per step (runtime/scheduler.py); False: each turn
    # steps on its own, interleaved token by token with the others (runtime/sharing.py)
    batch_decode: bool = False
    # with batch_decode: when the pool cannot give the running turns their next slots, the
    # newest is preempted, its KV "swap"ped to host memory (at most preemption_host_bytes at
    # once, else dropped) or dropped to "recompute" (kv/preemption.py), and resumed when pages
    # are free; a turn is then admitted once its prompt's pages are free, its decode pages
    # taken as it goes. None: a turn waits at admission until every page it may fill is free
    preemption: str | None = None
    preemption_host_bytes: int = GiB
    # with batch_decode: a prefill the runtime can run in chunks (runtime/chunked.py: `full`'s
    # plan) computes at most this many tokens per scheduler step, each step also advancing
    # every decoding turn; a prompt of at most this many tokens runs whole. 0 or None: every
    # prefill runs whole, as its own unit (the reference path), the default: chunks cut the
    # decoding turns' stalls but delay the long prompt's first token, and only `full`'s plan
    # chunks today, so a `full` baseline would run another prefill than the reuse strategies
    prefill_chunk_tokens: int | None = 0
    # the order prefills waiting for the engine run in (runtime/sharing.py FairLock):
    # "shortest" (the fewest tokens of text the store does not hold first, a prefill passed
    # over by at most 8 others; chosen on replayed tuning sessions, docs/server.md "Prefill
    # order"), or "arrival"; every prefill computes the same either way
    prefill_order: str = "shortest"
    # with batch_decode: prefills waiting for the engine may run back to back between two
    # decode steps while their estimated tokens to compute (what the store lacks) fit in this
    # many, at least one running (runtime/sharing.py FairLock); 0: one prefill per step.
    # 2048 chosen on a replay of the chat workload's tuning sessions (docs/server.md
    # "Prefill bursts")
    prefill_burst_tokens: int = 2048
    # running turns whose prompts open with the same tokens hold one copy of their full pages'
    # K/V when it is the same, bit for bit (kv/shared.py): each turn's output is what it is
    # alone, and the pool holds a common document or system prompt once. False: each turn
    # holds its own pages
    share_pages: bool = True

    def __post_init__(self) -> None:
        self._check_types()
        STRATEGIES.get(self.strategy)  # unknown names fail here, listing the known ones
        EVICTION_POLICIES.get(self.eviction)
        if self.kv_pages < 1:
            raise ConfigError(f"kv_pages must be >= 1, got {self.kv_pages}")
        if self.kv_bytes is not None and self.kv_bytes < 1:
            raise ConfigError(f"kv_bytes must be >= 1 (bytes), got {self.kv_bytes}")
        if self.page_size < 1:
            raise ConfigError(f"page_size must be >= 1 (tokens), got {self.page_size}")
        if self.store_bytes < 0:
            raise ConfigError(f"store_bytes must be >= 0, got {self.store_bytes}")
        if self.preemption is not None:
            PREEMPTION_POLICIES.get(self.preemption)  # unknown names fail, listing the known
            if not self.batch_decode:
                raise ConfigError(f"preemption={self.preemption!r} needs batch_decode=True "
                                  "(the batched scheduler preempts)")  # fmt: skip
        if self.preemption_host_bytes < 0:
            raise ConfigError(f"preemption_host_bytes must be >= 0, got "
                              f"{self.preemption_host_bytes}")  # fmt: skip
        if self.prefill_order not in PREFILL_ORDERS:
            raise ConfigError(f"prefill_order must be one of {', '.join(PREFILL_ORDERS)}, got "
                              f"{self.prefill_order!r}")  # fmt: skip
        burst = self.prefill_burst_tokens  # types: _check_types; here the ranges
        if burst < 0:
            raise ConfigError(f"prefill_burst_tokens must be a whole number of tokens >= 0 (0: "
                              f"one prefill per decode step), got {burst!r}")  # fmt: skip
        chunk = self.prefill_chunk_tokens
        if chunk is not None and chunk < 0:
            raise ConfigError(f"prefill_chunk_tokens must be a whole number of tokens >= 0 (0 or "
                              f"None: prefills run whole), got {chunk!r}")  # fmt: skip
        for name, options in self.strategy_options.items():  # here, not at the first request
            strategy = STRATEGIES.get(name)
            if not isinstance(options, Mapping):
                raise ConfigError(
                    f"strategy_options[{name!r}] must be a dict of options, "
                    f"got {type(options).__name__}"
                )
            try:
                strategy(**options)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"strategy_options[{name!r}]: {e}") from e

    def _check_types(self) -> None:
        """Plain fields by their declared types (agentcache/fieldtypes.py), then the rest."""
        check_field_types(self)
        for name, kinds, words in (
            ("strategy_options", (Mapping,), "a dict of strategy name -> options"),
            ("decode", (DecodeConfig,), "a DecodeConfig"),
            ("tiers", (TierConfig, type(None)), "a TierConfig or None"),
        ):
            value = getattr(self, name)
            if not isinstance(value, kinds):
                raise ConfigError(f"{name} must be {words}, got {value!r:.60}")
