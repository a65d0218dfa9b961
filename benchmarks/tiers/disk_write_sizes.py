"""Time per byte of the disk tier's write calls by extent size, with nothing else running.

Writes the same pages (the default model's page: 30 layers x 16 tokens x 3 KV heads x 64 dims,
fp32, K and V) through `DiskTier.write` in extents of 1, 8 and 64 pages, fsync on, into fresh
folders under `--dir`, and prints the median over `--reps` of the seconds spent inside write
calls (`counters.write_s`, what `bench-tiers` reports as write s).

    python benchmarks/tiers/disk_write_sizes.py --pages 256 --reps 5 --dir /tmp
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from agentcache.tiers.base import PageData, PageKey
from agentcache.tiers.disk import DiskTier

LAYERS, TOKENS, HEADS, DIMS = 30, 16, 3, 64


def seconds(pages: list[PageData], extent: int, parent: Path) -> float:
    folder = Path(tempfile.mkdtemp(prefix="disk-write-", dir=parent))
    try:
        tier = DiskTier(folder, 1 << 40)
        for first in range(0, len(pages), extent):
            batch = pages[first : first + extent]
            tier.write([(PageKey(f"s{first}-{j}"), page) for j, page in enumerate(batch)])
        tier.close()
        return tier.counters.write_s
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = p.parse_args()
    shape = (LAYERS, TOKENS, HEADS, DIMS)
    pages = [
        PageData(torch.randn(shape), torch.randn(shape), torch.arange(TOKENS))
        for _ in range(args.pages)
    ]
    mib = args.pages * 2 * LAYERS * TOKENS * HEADS * DIMS * 4 / 2**20
    print(f"{args.pages} pages, {mib:.0f} MiB, median of {args.reps}")
    print("| pages per write call | write calls | write s | MiB/s |")
    print("|---|---|---|---|")
    for extent in (1, 8, 64):
        runs = [seconds(pages, extent, args.dir) for _ in range(args.reps)]
        s = statistics.median(runs)
        calls = -(-args.pages // extent)
        print(f"| {extent} | {calls} | {s:.2f} | {mib / s:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
