#!/usr/bin/env bash
# Reproduces the figures in docs/benchmarks.md (about 40 minutes on 2 CPU cores).
# Sessions -01 (shift) and -02 (swing) of each workload, first 4 turns, 32 teacher-forced tokens;
# then the budget/ablation sweep on one swing session with 16 tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
for w in reflexion memgpt swe_agent; do
  .venv/bin/agentcache bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" \
    --max-turns 4 --out "docs/bench/$w"
done
.venv/bin/agentcache bench benchmarks/workloads/reflexion.jsonl --sessions reflexion-02 \
  --max-turns 4 --new-tokens 16 --sweep \
  --strategies full,pic,cacheblend,epic,cacheslide,default --out docs/bench/sweep
# boundary-token ablation of the default strategy (docs/benchmarks.md, "Boundary tokens")
for w in reflexion memgpt swe_agent; do
  .venv/bin/agentcache bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" \
    --max-turns 4 --new-tokens 16 --strategies full,rpdc,rpdc:boundary_k=16 \
    --out "docs/bench/boundary-$w"
done
