"""Multi-node what-if for docs/scaling.md: session routing vs a shared segment store.

Replays the bench workloads' sessions (real token counts of every segment on the default
model's tokenizer) over N vLLM instances. Each instance has a local memory tier of C bytes
(LRU, the connector's `SegmentStore`); every segment ever stored is also in a shared network
tier (the folder store, one per fleet). A turn needs its system and fixed segments: found in
the local tier -> local hit; else fetched from the network tier (bytes over the network);
new segments are written to both. Routing policies:

    random        each turn goes to an instance drawn at random (no locality; seeded)
    affinity      a session always goes to hash(session) % N (locality)

It also measures, on this machine, how fast the folder tier reads a segment (a stand-in for a
network tier's per-byte cost) and compares fetching with recomputing.

    PYTHONPATH=. python benchmarks/scaling/sim.py [--instances 4] [--memory-mb 512]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from agentcache.engines.vllm.storage import FolderSegmentStore
from agentcache.kv.store import StoredKV

WORKLOADS = Path(__file__).parents[1] / "workloads"
BENCH_WORKLOADS = ("memgpt", "reflexion", "swe_agent")  # their 24 tuning sessions
KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 4  # default model, fp32: layers * kv heads * dim * K,V


Sessions = list[tuple[str, list[list[tuple[str, str, int]]]]]


def load_sessions(tokenize: bool) -> Sessions:
    """(session, turns); a turn is [(kind, content key, tokens)]."""
    count: Callable[[str], int] = len
    if tokenize:
        from transformers import AutoTokenizer

        from agentcache.model.loading import convert_default_model, default_cache_dir

        tok = AutoTokenizer.from_pretrained(convert_default_model(default_cache_dir()))

        def count(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False))

    sessions = []
    for name in BENCH_WORKLOADS:
        for line in (WORKLOADS / f"{name}.jsonl").read_text().splitlines():
            obj = json.loads(line)
            if obj["split"] != "tune":  # the 24 sessions docs/scaling.md replays
                continue
            turns = []
            for t in obj["turns"]:
                segs = []
                for s in t["segments"]:
                    key = f"{zlib.crc32(s['text'].encode()):08x}"
                    segs.append(
                        (s["kind"], key, count(s["text"]) if tokenize else len(s["text"]) // 4)
                    )
                turns.append(segs)
            sessions.append((obj["name"], turns))
    return sessions


def simulate(
    sessions: Sessions, instances: int, memory_bytes: int, policy: str
) -> dict[str, float]:
    tiers = [OrderedDict[str, int]() for _ in range(instances)]
    rng = random.Random(0)
    stored: set[str] = set()
    local = network = computed = 0
    turn_no = 0
    # interleave sessions turn by turn, as concurrent agents would
    for ti in range(max(len(t) for _, t in sessions)):
        for name, turns in sessions:
            if ti >= len(turns):
                continue
            home = zlib.crc32(name.encode()) % instances
            i = home if policy == "affinity" else rng.randrange(instances)
            turn_no += 1
            tier = tiers[i]
            for kind, key, tokens in turns[ti]:
                size = tokens * KV_BYTES_PER_TOKEN
                if kind != "update" and key in tier:
                    tier.move_to_end(key)
                    local += size
                    continue
                if kind != "update" and key in stored:
                    network += size
                else:
                    computed += size
                stored.add(key)
                tier[key] = size
                while sum(tier.values()) > memory_bytes:
                    tier.popitem(last=False)
    reused = local + network
    return {
        "local_share_of_reused": local / max(1, reused),
        "network_gb": network / 1e9,
        "network_mb_per_turn": network / 1e6 / max(1, turn_no),
        "computed_share": computed / max(1, reused + computed),
    }


def measure_folder_tier(tokens: int = 1024, repeats: int = 5) -> float:
    """Seconds per token to read a segment of `tokens` tokens from the folder tier."""
    folder = Path(tempfile.mkdtemp(prefix="scaling-sim-"))
    kv = StoredKV(torch.randn(30, tokens, 3, 64), torch.randn(30, tokens, 3, 64),
                  torch.arange(tokens), "m", "t")  # fmt: skip
    FolderSegmentStore(folder, 1 << 30).put_content("c", kv)
    times = []
    for _ in range(repeats):
        store = FolderSegmentStore(folder, 1 << 30)  # cold memory tier: read from the folder
        t0 = time.perf_counter()
        assert store.lookup_content("m", "t", "c").kv is not None
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--memory-mb", type=int, default=512)
    ap.add_argument("--no-tokenizer", action="store_true", help="estimate tokens as chars / 4")
    args = ap.parse_args()
    sessions = load_sessions(not args.no_tokenizer)
    print(f"{len(sessions)} sessions, {sum(len(t) for _, t in sessions)} turns, "
          f"{args.instances} instances, {args.memory_mb} MB local tier each\n")  # fmt: skip
    print("| routing | reused KV served locally | network GB | network MB / turn | computed |")
    print("|---|---|---|---|---|")
    for policy in ("random", "affinity"):
        r = simulate(sessions, args.instances, args.memory_mb << 20, policy)
        print(f"| {policy} | {r['local_share_of_reused']:.2f} | {r['network_gb']:.2f} | "
              f"{r['network_mb_per_turn']:.0f} | {r['computed_share']:.2f} |")  # fmt: skip
    per_token = measure_folder_tier()
    mb_s = KV_BYTES_PER_TOKEN / per_token / 1e6
    print(f"\nfolder tier read (this machine): {per_token * 1e6:.1f} us/token = {mb_s:.0f} MB/s")
    for gbit in (10, 25, 100):
        us = KV_BYTES_PER_TOKEN * 8 / (gbit * 1e9) * 1e6
        print(f"network at {gbit} Gbit/s: {us:.1f} us/token of KV (fp32, {KV_BYTES_PER_TOKEN} B)")


if __name__ == "__main__":
    main()
