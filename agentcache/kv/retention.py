"""Keeping a conversation's KV across a tool pause: retention times and the pin table.

    parse_retention(value, field)   "30s", "5m", "1.5h", "250ms" or seconds -> seconds; a
                                    negative value, a non-duration, or one above the cap is a
                                    ValueError naming `field` (a strict check for a duration
                                    of one's own; a provider API's retention fields are
                                    granted up to the cap instead: server/cache_control.py)
    GapLearner                      the default retention, learned from the observed gaps
                                    between a turn that ended in a tool call and the
                                    conversation's next request (CacheTTL, Continuum): a
                                    high quantile of the recent gaps, capped
    PinTable                        segment -> (bytes, expiry, owner); pinned bytes never
                                    exceed `max_bytes` (a share of the pool), nor an owner's
                                    (a tenant's) `owner_share` of that; an owner's first
                                    `owner_reserve` of it is guaranteed: a full table gives
                                    an owner under it room by ending, soonest to expire
                                    first, pins of owners over theirs; an expired pin is no
                                    pin: evictable at once, without a timer
    RetainingStore                  the seam of a store that keeps entries for a time
                                    (the memory and the tiered store implement it)
    PauseBook                       the tool pauses waiting for their conversation's next
                                    request: when each ended and what it retained

Mechanism only: what a pin protects (which tier, what eviction skips) is the store's.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

# of the retained share, each tenant's guaranteed part unless set: up to four tenants each
# keep a quarter however busy the others are
DEFAULT_TENANT_RESERVE = 0.25
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|min|m|h)?\s*")


@dataclass(frozen=True)
class RetentionConfig:
    """`default_s`: retention before any gap is observed; `max_s`: the cap on any retention
    (from a request or learned); `pinned_share`: of the pool's bytes, the most pins may hold;
    `tenant_share`: of those, the most one tenant's pins may hold; `tenant_reserve`: of
    those, what each tenant is guaranteed (its pins up to it are never ended early, and a
    tenant under it ends other tenants' pins beyond theirs to get it; 0: no guarantee; None:
    `DEFAULT_TENANT_RESERVE`, or `tenant_share` when lower: `reserve`); `quantile`: of the
    observed gaps, the learned retention covers this many."""

    default_s: float = 60.0
    max_s: float = 600.0
    pinned_share: float = 0.25
    quantile: float = 0.9
    tenant_share: float = 0.5
    tenant_reserve: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.default_s <= self.max_s < math.inf:
            raise ValueError(
                f"retention default_s={self.default_s} must be from 0 to max_s={self.max_s}"
            )
        if not 0 <= self.pinned_share <= 1:
            raise ValueError(f"pinned_share must be from 0 to 1, got {self.pinned_share}")
        if not 0 < self.tenant_share <= 1:
            raise ValueError(f"tenant_share must be above 0 and at most 1, got {self.tenant_share}")
        if self.tenant_reserve is not None and not 0 <= self.tenant_reserve <= self.tenant_share:
            raise ValueError(
                f"tenant_reserve must be from 0 to tenant_share={self.tenant_share}, got "
                f"{self.tenant_reserve}"
            )
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")

    @property
    def reserve(self) -> float:
        """Each tenant's guaranteed part of the retained share (`tenant_reserve` resolved)."""
        if self.tenant_reserve is not None:
            return self.tenant_reserve
        return min(DEFAULT_TENANT_RESERVE, self.tenant_share)


def parse_retention(value: object, field: str, max_s: float) -> float:
    """Seconds from a number of seconds or a duration string; ValueError naming `field`,
    also above `max_s` (the server grants its API fields up to the cap instead)."""
    if isinstance(value, bool):
        seconds = math.nan
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)) is not None:
        seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    else:
        raise ValueError(
            f"{field}: {str(value)[:40]!r} is not a duration (seconds, or e.g. 30s, 5m, 250ms)"
        )
    if math.isnan(seconds) or seconds == math.inf:
        raise ValueError(f"{field}: {value!r} is not a finite duration")
    if seconds < 0:
        raise ValueError(f"{field}: {value!r} is negative; a retention time is >= 0")
    if seconds > max_s:
        raise ValueError(f"{field}: {value!r} is above the server's cap of {max_s:g} s")
    return seconds


def check_shares(share: float, owner_share: float, owner_reserve: float = 0.0) -> None:
    """ValueError unless `share` is from 0 to 1, `owner_share` above 0 and at most 1, and
    `owner_reserve` from 0 to `owner_share` (`RetainingStore.set_retain_share`)."""
    if not 0 <= share <= 1:
        raise ValueError(f"retain_share must be from 0 to 1, got {share}")
    if not 0 < owner_share <= 1:
        raise ValueError(f"owner_share must be above 0 and at most 1, got {owner_share}")
    if not 0 <= owner_reserve <= owner_share:
        raise ValueError(
            f"owner_reserve must be from 0 to owner_share={owner_share}, got {owner_reserve}"
        )


class GapLearner:
    """The default retention from the last `window` tool-pause gaps: their `quantile`, capped
    at `max_s`; `default_s` until `min_gaps` gaps are seen."""

    def __init__(self, config: RetentionConfig, window: int = 256, min_gaps: int = 8) -> None:
        self.config, self.min_gaps = config, min_gaps
        self._gaps: deque[float] = deque(maxlen=window)

    def observe(self, gap_s: float) -> None:
        if gap_s >= 0 and math.isfinite(gap_s):
            self._gaps.append(gap_s)

    def retention_s(self) -> float:
        c = self.config
        if len(self._gaps) < self.min_gaps:
            return c.default_s
        ordered = sorted(self._gaps)
        at = min(len(ordered) - 1, math.ceil(c.quantile * len(ordered)) - 1)
        return min(ordered[max(at, 0)], c.max_s)


@dataclass(frozen=True)
class PinResult:
    pinned: tuple[Hashable, ...]  # pinned (or re-pinned) until `until`
    refused: tuple[Hashable, ...]  # would exceed a cap (or not held): not pinned
    until: float
    nbytes: int = 0  # bytes of the pinned keys
    owner_refused: tuple[Hashable, ...] = ()  # of `refused`, those over the owner's share
    # other owners' pins ended to make room within this owner's reservation (their entries
    # stay stored, evictable as any other)
    preempted: tuple[Hashable, ...] = ()


@dataclass(frozen=True)
class RetentionStats:
    """A store's pins now: live pins and their bytes, the cap, pins refused for it so far,
    of those, pins refused for their owner's share, and pins ended early so far for another
    owner's reservation."""

    pinned_entries: int
    pinned_bytes: int
    max_bytes: int
    refused: int
    owner_refused: int = 0
    preempted: int = 0


class PinTable:
    """Pins on keys (a store's segments) with a byte size, an expiry on the caller's clock
    (`now`, seconds) and an owner (a tenant; None: no one's). Contract: `pinned_bytes(now) <=
    max_bytes` always, and an owner's live pins hold at most `owner_share` of `max_bytes`
    (None's: no bound but the table's). An owner's pins up to `owner_reserve` of `max_bytes`
    are its reservation: never ended early. When a pin does not fit the table and its owner
    stays within its reservation with it, `pin` ends other owners' pins beyond their own
    reservations (soonest to expire first; `PinResult.preempted`) if that makes room, and
    otherwise refuses; beyond its reservation an owner never takes another's pin, and `pin`
    refuses (and says which). An expired pin counts nowhere."""

    def __init__(
        self, max_bytes: int, owner_share: float = 1.0, owner_reserve: float = 0.0
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.owner_share = owner_share
        self.owner_reserve = owner_reserve
        # key -> (bytes, expiry, owner)
        self._pins: dict[Hashable, tuple[int, float, Hashable]] = {}
        self.refused = 0  # pins refused for a cap (the table's or an owner's)
        self.owner_refused = 0  # of those, for the owner's share
        self.preempted = 0  # pins ended early for another owner's reservation

    def bound(self, max_bytes: int, owner_share: float, owner_reserve: float) -> None:
        """Set the table's cap and an owner's part and reservation of it (checked by the
        caller: `check_shares`); pins above a lowered cap stay until they expire."""
        self.max_bytes, self.owner_share = max_bytes, owner_share
        self.owner_reserve = owner_reserve

    @property
    def owner_max_bytes(self) -> int:
        return int(self.owner_share * self.max_bytes)

    @property
    def owner_reserve_bytes(self) -> int:
        return int(self.owner_reserve * self.max_bytes)

    def pin(
        self, sizes: Iterable[tuple[Hashable, int]], seconds: float, now: float,
        owner: Hashable = None,
    ) -> PinResult:  # fmt: skip
        """Pin each (key, bytes) for `owner` until now + seconds (an existing pin is extended,
        never shortened), in order, while the caps allow."""
        self.expire(now)
        until = now + seconds
        total, mine = self.pinned_bytes(now), self.owner_bytes(owner, now)
        pinned, refused, over_share, preempted = [], [], [], []
        for key, nbytes in sizes:
            held = self._pins.get(key)
            grow = nbytes - (held[0] if held else 0)
            grow_mine = nbytes - (held[0] if held and held[2] == owner else 0)
            over_table = total + max(grow, 0) > self.max_bytes
            over_mine = owner is not None and mine + max(grow_mine, 0) > self.owner_max_bytes
            reserved = mine + max(grow_mine, 0) <= self.owner_reserve_bytes
            if over_table and not over_mine and reserved and held is None:
                ended = self._preempt(total + grow - self.max_bytes, owner)
                preempted += ended
                total -= sum(b for _, b in ended)
                over_table = total + grow > self.max_bytes
            if over_table or over_mine:
                refused.append(key)
                self.refused += 1
                if not over_table:
                    over_share.append(key)
                    self.owner_refused += 1
                continue
            self._pins[key] = (nbytes, max(until, held[1] if held else until), owner)
            total, mine = total + grow, mine + grow_mine
            pinned.append(key)
        nbytes_pinned = sum(self._pins[k][0] for k in pinned)
        return PinResult(
            tuple(pinned), tuple(refused), until, nbytes_pinned, tuple(over_share),
            tuple(k for k, _ in preempted),
        )  # fmt: skip

    def _preempt(self, need: int, owner: Hashable) -> list[tuple[Hashable, int]]:
        """End other owners' pins (all live: `pin` expired the rest first), soonest to expire
        first, each only while its owner keeps its reservation, until `need` bytes are free;
        none when they cannot free that many. Returns the (key, bytes) ended."""
        held: dict[Hashable, int] = {}
        for b, _, o in self._pins.values():
            held[o] = held.get(o, 0) + b
        chosen, freed = [], 0
        by_expiry = sorted(self._pins.items(), key=lambda kv: kv[1][1])
        for key, (b, _, o) in by_expiry:
            if freed >= need:
                break
            if o != owner and held[o] - b >= self.owner_reserve_bytes:
                held[o] -= b
                chosen.append((key, b))
                freed += b
        if freed < need:
            return []
        self.unpin(k for k, _ in chosen)
        self.preempted += len(chosen)
        return chosen

    def owner_bytes(self, owner: Hashable, now: float) -> int:
        """Bytes of `owner`'s live pins."""
        return sum(b for b, until, o in self._pins.values() if until > now and o == owner)

    def is_pinned(self, key: Hashable, now: float) -> bool:
        held = self._pins.get(key)
        return held is not None and held[1] > now

    def pinned_bytes(self, now: float) -> int:
        return sum(b for b, until, _ in self._pins.values() if until > now)

    def unpin(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._pins.pop(key, None)

    def clear(self) -> None:
        """Forget every pin (the entries are gone); the refusal counters stay."""
        self._pins.clear()

    def expire(self, now: float) -> list[Hashable]:
        """Forget the pins that expired; returns their keys."""
        gone = [k for k, (_, until, _) in self._pins.items() if until <= now]
        self.unpin(gone)
        return gone

    def stats(self, now: float) -> RetentionStats:
        live = [b for b, until, _ in self._pins.values() if until > now]
        return RetentionStats(
            len(live), sum(live), self.max_bytes, self.refused, self.owner_refused,
            self.preempted,
        )  # fmt: skip


class RetainingStore(ABC):
    """A segment store that keeps entries for a time (a conversation across a tool pause).

    Contract:
    - `retain` pins the entries it holds of these content ids (model and tokenizer as in a
      lookup) for `owner` (a tenant; None: no one's) until `seconds` from the store's clock,
      in order, while the pinned bytes stay within the retained share of the store, and the
      owner's within its part of that share (`set_retain_share`); the rest are refused
      (`PinResult.refused`, with the ids it does not hold; those over the owner's part also
      in `PinResult.owner_refused`). A pin is extended, never shortened. `seconds` was
      checked by the caller (`parse_retention`).
    - A pinned entry is never evicted before its pin ends: it expires, or (beyond its
      owner's reservation, `set_retain_share`) it is ended for an owner under its own
      (`PinResult.preempted`); an ended pin protects nothing (the entry is evictable at once,
      in its policy's turn). A put that cannot fit beside the pinned entries is rejected,
      never served by evicting one.
    - Pins are per entry, and an entry's key carries its scope (`segment_content_id`), so a
      pin protects only the entries of the scope whose ids were named.
    - `release` drops these entries' pins (they stay stored, evictable as any other).
    """

    @abstractmethod
    def retain(
        self, model_id: str, tokenizer_id: str, cids: Sequence[str], seconds: float,
        owner: Hashable = None,
    ) -> PinResult: ...  # fmt: skip

    @abstractmethod
    def release(self, model_id: str, tokenizer_id: str, cids: Sequence[str]) -> None: ...

    @abstractmethod
    def set_retain_share(
        self, share: float, owner_share: float = 1.0, owner_reserve: float = 0.0
    ) -> None:
        """Pinned bytes may be at most `share` (0 to 1) of the bytes retained entries stay in
        (the store's, or its fast tier's), one owner's at most `owner_share` (above 0, at
        most 1) of that, and `owner_reserve` of it (0 to `owner_share`) is each owner's
        reservation (`PinTable`); pins above a lowered cap stay until they expire."""

    @abstractmethod
    def retention_stats(self) -> RetentionStats: ...


V = TypeVar("V")


class PauseBook(Generic[V]):
    """Tool pauses waiting for their conversation's next request, each under one or more keys
    (e.g. the tenant and the fingerprint of the tool-call message the next request resends):
    when it ended and a value (what it retained). Bounded: the oldest `max_pauses` are
    forgotten first. Not thread-safe (its owner locks)."""

    def __init__(self, max_pauses: int = 4096) -> None:
        if max_pauses < 1:
            raise ValueError(f"max_pauses must be >= 1, got {max_pauses}")
        self.max_pauses = max_pauses
        self._pauses: OrderedDict[int, tuple[float, V, tuple[Hashable, ...]]] = OrderedDict()
        self._by_key: dict[Hashable, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._pauses)

    def pause(self, keys: Iterable[Hashable], value: V, now: float) -> None:
        """A turn ended in a tool call at `now`; a later request naming any of `keys` resumes
        it (a key already waiting is taken over by this pause)."""
        keys = tuple(keys)
        for key in keys:
            self._drop(self._by_key.get(key))
        self._next += 1
        self._pauses[self._next] = (now, value, keys)
        for key in keys:
            self._by_key[key] = self._next
        while len(self._pauses) > self.max_pauses:
            self._drop(next(iter(self._pauses)))

    def resume(self, keys: Iterable[Hashable], now: float) -> tuple[float, V] | None:
        """The first waiting pause any of `keys` names, forgotten: (its gap in seconds, its
        value); None when none waits."""
        for key in keys:
            pid = self._by_key.get(key)
            if pid is not None:
                ended, value, _ = self._pauses[pid]
                self._drop(pid)
                return now - ended, value
        return None

    def _drop(self, pid: int | None) -> None:
        if pid is None or pid not in self._pauses:
            return
        _, _, keys = self._pauses.pop(pid)
        for key in keys:
            if self._by_key.get(key) == pid:
                del self._by_key[key]
