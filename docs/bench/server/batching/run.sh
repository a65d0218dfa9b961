#!/usr/bin/env bash
# The batched-decode runs that docs/server.md ("Batched decode") points to: 1, 4 and 16 concurrent agents of 48 greedy
# tokens each on one embedded engine, batched against interleaved, two repeats, ratios within
# each repeat. Run from the repository root (as root, nice gives it priority).
set -euo pipefail
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 2 --out docs/bench/server/batching/smollm2-48-quiet
uptime
