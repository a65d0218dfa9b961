"""The tiered store's configuration (`TierConfig`) and its counters (`TierStats`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache.errors import ConfigError
from agentcache.fieldtypes import check_field_types
from agentcache.policy.spill import SPILL_POLICIES
from agentcache.tiers.base import TierCapacityError
from agentcache.units import GiB


@dataclass(frozen=True)
class TierConfig:
    """Capacities of the tiers (bytes of K/V), the spill policy, and the disk folder.
    host_bytes 0: no host tier; disk_dir None: no disk tier."""

    fast_bytes: int = 1 * GiB
    host_bytes: int = 0
    disk_dir: Path | None = None
    disk_bytes: int = 16 * GiB
    spill: str = "slide"
    spill_options: dict[str, Any] = field(default_factory=dict)
    page_size: int = 16
    fsync: bool = True
    # the disk journal is compacted once it holds this many lines and 4x the live records
    journal_compact_lines: int = 4096
    decoupled_load: bool = True  # per-layer loader thread during selective prefill
    adopt_recomputed: bool = True  # recomputed/fused tokens of a reused segment update it
    # of the fast tier's bytes, the most that retained segments (`TieredSegmentStore.retain`)
    # keep there; beyond it a retention is refused for the segments that do not fit
    retain_share: float = 0.25

    def __post_init__(self) -> None:
        check_field_types(self)  # plain fields by their declared types
        policy = SPILL_POLICIES.get(self.spill)  # unknown names list the known ones
        if min(self.fast_bytes, self.host_bytes, self.disk_bytes) < 0 or self.page_size < 1:
            raise ConfigError("tier capacities must be >= 0 and page_size >= 1")
        if self.journal_compact_lines < 1:
            raise ConfigError(
                f"journal_compact_lines must be >= 1, got {self.journal_compact_lines}"
            )
        if self.disk_dir is not None:  # a str or os.PathLike, kept a Path
            if not isinstance(self.disk_dir, str | os.PathLike) or not str(self.disk_dir).strip():
                raise ConfigError(
                    f"disk_dir must be a folder's path or None, got {self.disk_dir!r:.60}"
                )
            object.__setattr__(self, "disk_dir", Path(self.disk_dir))
        if not 0 <= self.retain_share <= 1:
            raise ConfigError(f"retain_share must be from 0 to 1, got {self.retain_share}")
        if not isinstance(self.spill_options, Mapping):
            raise ConfigError(
                f"spill_options must be a dict of options, got {type(self.spill_options).__name__}"
            )
        try:  # here, not when the engine starts
            policy(**self.spill_options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"spill_options for {self.spill!r}: {e}") from e

    def check_working_set(self, token_bytes: int, tokens: int) -> None:
        """Fail at start-up when the fast tier, or the lowest tier (which keeps only segments
        that fit in it), cannot hold one request's reused KV."""
        need = token_bytes * tokens
        tiers = [("fast", self.fast_bytes)]
        if self.disk_dir is not None:
            tiers.append(("disk", self.disk_bytes))
        elif self.host_bytes:
            tiers.append(("host", self.host_bytes))
        for name, capacity in tiers:
            if capacity < need:
                raise TierCapacityError(
                    f"{name} tier of {capacity} bytes cannot hold one request's working set "
                    f"({tokens} tokens x {token_bytes} bytes = {need}); raise {name}_bytes to "
                    "at least that, or lower kv_pages"
                )


@dataclass
class TierStats:
    spills: int = 0  # tier-full events that asked the spill policy
    dropped_clean: int = 0  # pages dropped without a write
    written_pages: int = 0  # pages written to a lower tier by spills
    # K/V bytes the disk tier lacked when written: a page with no disk copy counts whole, one
    # with a stale copy counts its stale slots, a current copy nothing
    persist_required_bytes: int = 0
    persist_required_page_bytes: int = 0  # the same counting every page not current whole
    failed_spills: int = 0
    unpromoted: int = 0  # pages served from a lower tier and left there (no room above)
    prefetched_pages: int = 0  # pages moved up to fast by `prefetch`, ahead of a lookup
    updates: int = 0  # pages replaced by a newer version
    whole_updates: int = 0  # ... of which no current copy could be read to merge into
    errors: list[str] = field(default_factory=list)  # last tier errors, newest last
    invalid_records: int = 0  # segment index records on disk that were malformed (dropped)
