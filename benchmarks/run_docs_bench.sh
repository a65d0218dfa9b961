#!/usr/bin/env bash
# Reproduces the reuse figures in docs/benchmarks.md (about 70 minutes on 2 CPU cores).
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
# fidelity at matched compute (docs/benchmarks.md, "Fidelity at matched compute"); ~25 min
low="full,pic,cacheblend,cacheblend:ratio=0.3,epic,epic:boundary_k=16,rpdc,rpdc:ratio=0.15"
low="$low,rpdc:boundary_k=16,rpdc:boundary_k=16:ratio=0.15,rpdc:boundary_k=32:ratio=0.15"
high="full,epic,rpdc:ratio=0.5,rpdc:boundary_k=32,rpdc:boundary_k=64:ratio=0.1"
for w in reflexion memgpt swe_agent; do
  .venv/bin/agentcache bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" \
    --max-turns 4 --new-tokens 16 --strategies "$low" --out "docs/bench/frontier/$w"
done
for w in reflexion memgpt; do
  .venv/bin/agentcache bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" \
    --max-turns 4 --new-tokens 16 --strategies "$high" --out "docs/bench/frontier/hi-$w"
done
.venv/bin/python benchmarks/frontier.py docs/bench/frontier/*/results.json --out docs/bench/frontier
