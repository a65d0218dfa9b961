#!/usr/bin/env bash
# The batched-decode runs that docs/server.md ("Batched decode") points to, on one embedded
# engine, batched against interleaved, ratios within each repeat (which runs first alternates):
#   smollm2-lone-32   one agent of 32 greedy tokens, 10 repeats (a lone request's speed)
#   smollm2-48-lone   1, 4 and 16 concurrent agents of 48 greedy tokens, 3 repeats
#   smollm2-48-t1/-t2 1 and 16 agents of 48 greedy tokens, 3 repeats, 1 and 2 torch threads,
#                     nothing else running (the scheduler with fused steps and prefill order)
#   smollm2-48-t1-calls  1, 4 and 16 agents, 1 thread, on an AVX-512 Xeon (decode rows in
#                     matmul calls of exactly 16 there)
#   smollm2-48-t1-burst  1, 4 and 16 agents, 1 thread, each batched engine also with
#                     prefill bursts of 2048 tokens (`batched` there is prefill_burst_tokens=0)
#   smollm2-48-t2-burst  the same with 2 torch threads
#   epyc-48-t2-burst     the same on a 2-core AMD EPYC (calls of any multiple of 4 rows there)
# (smollm2-48 and smollm2-48-quiet, older: 1/4/16 agents, 2 repeats, with the command
# `nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 --repeats 2
# --out <dir>` at the commits their results.json record.)
# Run from the repository root.
set -euo pipefail
uptime
HF_HUB_OFFLINE=1 nice -n 5 python benchmarks/server/batch_decode.py --agents 1 --new-tokens 32 \
    --repeats 10 --out docs/bench/server/batching/smollm2-lone-32
uptime
HF_HUB_OFFLINE=1 nice -n 5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 3 --out docs/bench/server/batching/smollm2-48-lone
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 16 --new-tokens 48 \
    --repeats 3 --threads 1 --out docs/bench/server/batching/smollm2-48-t1
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 16 --new-tokens 48 \
    --repeats 3 --threads 2 --out docs/bench/server/batching/smollm2-48-t2
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 3 --threads 1 --out docs/bench/server/batching/smollm2-48-t1-calls
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 3 --threads 1 --bursts 2048 --out docs/bench/server/batching/smollm2-48-t1-burst
uptime
HF_HUB_OFFLINE=1 nice -n -5 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 3 --threads 2 --bursts 2048 --out docs/bench/server/batching/smollm2-48-t2-burst
uptime
HF_HUB_OFFLINE=1 python benchmarks/server/batch_decode.py --agents 1 4 16 --new-tokens 48 \
    --repeats 3 --threads 2 --bursts 2048 --out docs/bench/server/batching/epyc-48-t2-burst
uptime
