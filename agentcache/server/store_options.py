"""`agentcache serve`'s segment-store flags: one flat in-memory store of `--store-bytes`, or,
when a lower tier is named, a tiered store (agentcache/tiers, docs/tiers.md) whose fast tier is
`--store-bytes` and whose host and disk tiers take what it spills instead of dropping it.

    --store-bytes        fast tier (or the flat store)     default 4 GiB
    --store-host-bytes   host tier below it                 default none
    --store-disk-dir     disk tier below that, its folder   default none
    --store-disk-bytes   the disk tier's capacity           default 16 GiB
    --store-spill        what a full tier moves down        default slide

Every check runs before the model loads; a bad value is a `ConfigError` naming its flag."""

from __future__ import annotations

import argparse

from agentcache.argtypes import byte_size, path_arg
from agentcache.errors import AgentCacheError, ConfigError
from agentcache.policy.spill import SPILL_POLICIES
from agentcache.runtime.config import EngineConfig
from agentcache.tiers.config import TierConfig

STORE_BYTES = EngineConfig.store_bytes  # the engine's default: the flat store, or the fast tier
TIER_FLAGS = {"store_host_bytes": "--store-host-bytes", "store_disk_dir": "--store-disk-dir",
              "store_disk_bytes": "--store-disk-bytes", "store_spill": "--store-spill"}  # fmt: skip


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="embedded backend: the segment store's capacity, e.g. 4GiB (with "
                   "--store-host-bytes or --store-disk-dir: its fast tier's; default: "
                   "4GiB)")  # fmt: skip
    p.add_argument("--store-host-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="embedded backend: a host-memory tier below the store: segments the "
                   "full store would drop are spilled here, and promoted back when a request "
                   "reads them (default: none; see docs/tiers.md)")  # fmt: skip
    p.add_argument("--store-disk-dir", type=path_arg, default=None, metavar="DIR",
                   help="embedded backend: a disk tier in this folder, the lowest, also kept "
                   "across restarts (default: none)")  # fmt: skip
    p.add_argument("--store-disk-bytes", type=byte_size, default=None, metavar="SIZE",
                   help="with --store-disk-dir: the disk tier's capacity (default: "
                   "16GiB)")  # fmt: skip
    p.add_argument("--store-spill", choices=SPILL_POLICIES.names(), default=None,
                   help="with a lower tier: what a full tier moves down, by the spill policy "
                   "(default: slide)")  # fmt: skip


def tier_config(args: argparse.Namespace) -> TierConfig | None:
    """The tiered store the flags ask for; None for the flat store (no tier flag given).
    ConfigError for flags that cannot apply, naming them."""
    given = [flag for name, flag in TIER_FLAGS.items() if getattr(args, name) is not None]
    if not given:
        return None
    if args.backend != "embedded":
        raise ConfigError(f"{', '.join(given)} apply to the embedded backend's segment store; "
                          "--backend vllm keeps segments in its folder (--store-dir)")  # fmt: skip
    if args.store_disk_bytes is not None and args.store_disk_dir is None:
        raise ConfigError("--store-disk-bytes needs --store-disk-dir (the disk tier's folder)")
    if args.store_host_bytes is None and args.store_disk_dir is None:
        raise ConfigError(f"{given[0]} needs a tier to spill to: --store-host-bytes or "
                          "--store-disk-dir")  # fmt: skip
    default = TierConfig()
    return TierConfig(
        fast_bytes=STORE_BYTES if args.store_bytes is None else args.store_bytes,
        host_bytes=args.store_host_bytes or 0,
        disk_dir=args.store_disk_dir,
        disk_bytes=args.store_disk_bytes or default.disk_bytes,
        spill=args.store_spill or default.spill,
        retain_share=args.retention_share,  # TurnRetention sets the same share of fast_bytes
    )


def check_disk_folder(tiers: TierConfig | None) -> None:
    """Open and close the disk tier's folder, so that one it refuses (a file, not writable,
    holding symbolic links, another process's) fails now, not after the model has loaded.
    ConfigError naming `--store-disk-dir` with the tier's own reason."""
    if tiers is None or tiers.disk_dir is None:
        return
    from agentcache.tiers.disk import DiskTier

    try:
        DiskTier(tiers.disk_dir, tiers.disk_bytes, tiers.fsync, tiers.journal_compact_lines).close()
    except AgentCacheError as e:
        raise ConfigError(f"--store-disk-dir {tiers.disk_dir}: {e}") from e
