"""A writer process for the crash test: puts segments into a tiered store whose fast tier
holds two segments (so every put spills to disk), dirties some (before their first disk
copy, and again after it, so spills and persists write deltas), persists, and prints
"committed <i>" once segment i is durable. The test kills it with SIGKILL at random.

With `journal` as the second argument it instead rewrites four disk pages over and over
(page k holds `round_page(i)` for the last round i with i % 4 == k), each in an extent with
three scratch pages it drops at once, and records the round in the journal's metadata, so
the journal is compacted and mostly-dead extents are reclaimed every few rounds; it prints
"round <i>" once round i is durable."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from agentcache.kv.store import StoredKV, content_id
from agentcache.tiers import DiskTier, PageData, PageKey, TierConfig, TieredSegmentStore

M, T = "model", "tok"
TOKENS = 48  # three pages
PAGE_BYTES = 16 * 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 heads, dim 8, fp32


def ids(i: int) -> list[int]:
    return [i, i + 1, i + 2]


def version1(i: int) -> StoredKV:
    g = torch.Generator().manual_seed(i)
    keys = torch.randn((2, TOKENS, 2, 8), generator=g)
    values = torch.randn((2, TOKENS, 2, 8), generator=g)
    return StoredKV(keys, values, torch.arange(TOKENS), M, T, f"ctx{i}")


FIRST = 0b1000_0000_0010_0011  # slots of page 0 a reuse recomputes before the disk copy
SECOND = 0b0000_0110_0000_0001  # ... and after it (segments i % 3 == 0)


def version2_page0(i: int) -> PageData:
    """The recomputed K/V of page 0 a reuse would leave (only the masked slots are taken)."""
    g = torch.Generator().manual_seed(10_000_000 + i)
    return PageData(
        torch.randn((2, 16, 2, 8), generator=g),
        torch.randn((2, 16, 2, 8), generator=g),
        torch.arange(500, 516),
    )


def open_store(folder: Path, fast_pages: int = 6) -> TieredSegmentStore:
    config = TierConfig(
        fast_bytes=fast_pages * PAGE_BYTES,
        disk_dir=folder,
        disk_bytes=1 << 30,
        journal_compact_lines=8,  # compact often, so that kills also land inside compactions
    )
    return TieredSegmentStore(config)


def main(folder: Path, first: int) -> None:
    store = open_store(folder)
    i = first
    while True:
        store.put(ids(i), version1(i))
        if i % 3 == 0:
            cid = content_id(ids(i), "segment", None)
            store.update_pages(M, T, cid, {0: (version2_page0(i), FIRST)})
        if i % 2 == 1:
            store.persist()
            print(f"committed {i - 1} {i}", flush=True)
            for j in (i - 1, i):  # on disk now: the next spill or persist writes a delta
                if j % 3 == 0 and store.lookup(M, T, ids(j)).kv is not None:
                    cid = content_id(ids(j), "segment", None)
                    store.update_pages(M, T, cid, {0: (version2_page0(j), SECOND)})
        i += 1


def round_page(i: int) -> PageData:
    g = torch.Generator().manual_seed(20_000_000 + i)
    return PageData(
        torch.randn((2, 16, 2, 8), generator=g),
        torch.randn((2, 16, 2, 8), generator=g),
        torch.arange(i, i + 16),
    )


def open_journal_tier(folder: Path) -> DiskTier:
    return DiskTier(folder, 64 * PAGE_BYTES, fsync=True, compact_lines=8, reclaim_min_bytes=0)


def main_journal(folder: Path) -> None:
    tier = open_journal_tier(folder)
    i = int(tier.meta.get("round", -1)) + 1
    while True:
        scratch = [PageKey(f"x/{i}/{j}") for j in range(3)]
        tier.write(
            [(PageKey(f"p/{i % 4}"), round_page(i))] + [(k, round_page(-1)) for k in scratch]
        )
        tier.drop(scratch)
        tier.put_meta("round", i)
        print(f"round {i}", flush=True)
        i += 1


if __name__ == "__main__":
    if sys.argv[2] == "journal":
        main_journal(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]), int(sys.argv[2]))
