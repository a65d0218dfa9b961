"""kill -9 a writer mid-spill; a new process serves only correct KV and every committed
segment; corrupt or missing page files are CHECKSUM misses."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from agentcache.kv.store import MissReason, StoredKV
from agentcache.tiers import PageKey
from tests.tiers.crash_writer import (
    FIRST,
    PAGE_BYTES,
    SECOND,
    M,
    T,
    ids,
    open_journal_tier,
    open_store,
    round_page,
    version1,
    version2_page0,
)

ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(
    folder: Path, first: int | str, rng: random.Random, commits: tuple[int, int] = (2, 6)
) -> set[int]:
    """Start a writer at segment `first`, kill -9 it after a random number of commits and a
    random delay; returns the segments (or rounds) it reported committed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.tiers.crash_writer", str(folder), str(first)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    committed: set[int] = set()
    target = rng.randint(*commits)
    try:
        while len(committed) < 2 * target:
            line = proc.stdout.readline()
            assert line, f"writer exited early with {proc.poll()}"
            committed.update(int(x) for x in line.split()[1:])
        time.sleep(rng.uniform(0.0, 0.03))  # land somewhere inside the next puts and spills
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return committed


def merged(i: int, mask: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Page 0 of version 1 with the slots in `mask` from `version2_page0(i)`."""
    v1, v2 = version1(i), version2_page0(i)
    keys, values = v1.keys[:, :16].clone(), v1.values[:, :16].clone()
    positions = v1.positions[:16].clone()
    idx = torch.tensor([j for j in range(16) if mask >> j & 1])
    keys[:, idx], values[:, idx] = v2.keys[:, idx], v2.values[:, idx]
    positions[idx] = v2.positions[idx]
    return keys, values, positions


def valid(i: int, got: StoredKV) -> bool:
    """Equal to version 1, or (segments updated by the writer) version 1 with the slots of
    its first update, or of both, taken from the recomputed page 0."""
    want = version1(i)
    rest = (
        torch.equal(got.keys[:, 16:], want.keys[:, 16:])
        and torch.equal(got.values[:, 16:], want.values[:, 16:])
        and torch.equal(got.positions[16:], want.positions[16:])
    )
    page0 = (got.keys[:, :16], got.values[:, :16], got.positions[:16])
    versions = [(want.keys[:, :16], want.values[:, :16], want.positions[:16])]
    if i % 3 == 0:
        versions += [merged(i, FIRST), merged(i, FIRST | SECOND)]
    return rest and any(
        all(torch.equal(a, b) for a, b in zip(page0, v, strict=True)) for v in versions
    )


def test_kill_mid_spill_loses_no_committed_segment_and_serves_only_correct_kv(
    tmp_path: Path,
) -> None:
    rng = random.Random(4)
    committed: set[int] = set()
    both = 0  # segments served with both updates: the second reached disk as a delta
    for round_ in range(3):  # the same folder survives repeated crashes
        committed |= run_and_kill(tmp_path, 1000 * round_, rng)
        store = open_store(tmp_path, fast_pages=1024)
        for i in committed:
            got = store.lookup(M, T, ids(i))
            assert got.kv is not None, f"committed segment {i} lost ({got.miss})"
            assert valid(i, got.kv), f"segment {i} served wrong KV"
            both += i % 3 == 0 and torch.equal(got.kv.keys[:, :16], merged(i, FIRST | SECOND)[0])
        for i in range(1000 * round_, 1000 * round_ + 40):
            if i in committed:
                continue
            got = store.lookup(M, T, ids(i))
            if got.kv is not None:
                assert valid(i, got.kv), f"uncommitted segment {i} served wrong KV"
        store.close()
    assert len(committed) >= 12
    assert both > 0 and store.tier("disk").counters.delta_writes == 0  # reads only, after a kill


def test_corrupt_and_missing_files_after_restart_are_checksum_misses(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    for i in range(0, 12):
        store.put(ids(i * 10), version1(i * 10))
    store.persist()
    store.close()
    files = sorted((tmp_path / "extents").iterdir())
    files[0].unlink()
    data = bytearray(files[-1].read_bytes())
    data[-3] ^= 0x01
    files[-1].write_bytes(bytes(data))
    again = open_store(tmp_path, fast_pages=1024)
    results = [again.lookup(M, T, ids(i * 10)) for i in range(12)]
    bad = [r for r in results if r.kv is None]
    assert bad and all(r.miss is MissReason.CHECKSUM for r in bad)
    for i, r in enumerate(results):
        if r.kv is not None:
            assert valid(i * 10, r.kv)
    assert again.tier("disk").counters.corrupt == len(bad)


def test_kill_during_journal_compaction_keeps_the_last_committed_state(tmp_path: Path) -> None:
    """A writer whose journal is compacted and whose extents are reclaimed every few rounds,
    killed at random: the reopened tier holds a state at or after its last committed round,
    every page is that state's, and dead extent bytes do not pile up."""
    rng = random.Random(7)
    for _ in range(4):
        # 40-120 rounds: the journal is compacted every 10 (20 lines, 4 per live record)
        last = max(run_and_kill(tmp_path, "journal", rng, commits=(20, 60)))
        # >= 120 journal records were appended; compaction kept at most 4 per live record
        assert len((tmp_path / "journal.log").read_bytes().splitlines()) <= 40
        tier = open_journal_tier(tmp_path)
        tier.drop([k for k in tier.page_keys() if k.startswith("x/")])  # a killed round's scratch
        r = int(tier.meta["round"])
        assert r >= last, f"round {last} was committed, the journal replays round {r}"
        for k in range(4):
            # the last write to page k at or before round r, or round r + 1's own write (its
            # page can be durable while its round record is not)
            newest = max(i for i in range(r + 2) if i % 4 == k)
            choices = {newest} | ({newest - 4} if newest == r + 1 and newest >= 4 else set())
            got = tier.read(PageKey(f"p/{k}"))
            assert got is not None and any(
                torch.equal(got.keys, round_page(i).keys)
                and torch.equal(got.positions, round_page(i).positions)
                for i in choices
            ), f"page {k} holds no state of round {r}"
        # reclaimed down to 2x live, by the writer or (killed before its reclaim) at this open
        assert tier.file_bytes <= 2 * 4 * (PAGE_BYTES + 8 * 16)
        assert len(list((tmp_path / "extents").iterdir())) <= 4
        tier.close()
