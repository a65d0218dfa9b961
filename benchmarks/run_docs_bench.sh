#!/usr/bin/env bash
# Reproduces the reuse figures in docs/benchmarks.md (about 5 hours on 2 CPU cores).
# `rpdc` alone is the current default (extra=0.2, probe_window=128); runs that measured the
# earlier default name it in full, `rpdc:ratio=0.3:probe_window=256`.
set -euo pipefail
cd "$(dirname "$0")/.."
ac=.venv/bin/agentcache
# every strategy, sessions -01 (shift) and -02 (swing), first 4 turns, 32 teacher-forced tokens
for w in reflexion memgpt swe_agent; do
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --out "docs/bench/$w"
done
# the default against full recompute and pic on every session and turn (~40 min)
for w in reflexion memgpt swe_agent; do
  $ac bench "benchmarks/workloads/$w.jsonl" --strategies full,pic,default --out "docs/bench/wide-$w"
done
# the default with the probe shortcut on every swe_agent turn (~25 min)
$ac bench benchmarks/workloads/swe_agent.jsonl --strategies full,rpdc --out docs/bench/shortcut-swe_agent
# larger budgets and epic on the same turns: greedy exact match against TTFT (~60 min)
for w in reflexion memgpt swe_agent; do
  $ac bench "benchmarks/workloads/$w.jsonl" \
    --strategies full,rpdc:extra=0.5,rpdc:extra=1:probe_redo=true,epic --out "docs/bench/wide-budget-$w"
done
# where greedy decoding parts from full's (docs/benchmarks.md, "Where greedy decoding parts")
.venv/bin/python benchmarks/greedy_margins.py docs/bench/wide-reflexion/results.json \
  --strategies pic,rpdc --out docs/bench/wide-reflexion/margins.md
# budget/ablation sweep on one swing session, 16 tokens
$ac bench benchmarks/workloads/reflexion.jsonl --sessions reflexion-02 --max-turns 4 \
  --new-tokens 16 --sweep --strategies full,pic,cacheblend,epic,cacheslide,default \
  --out docs/bench/sweep
# boundary-token ablation of the earlier default (docs/benchmarks.md, "Boundary tokens")
old=rpdc:ratio=0.3:probe_window=256
for w in reflexion memgpt swe_agent; do
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "full,$old,$old:boundary_k=16" --out "docs/bench/boundary-$w"
done
# fidelity at matched compute (docs/benchmarks.md, "Fidelity at matched compute"); ~2 hours
o=probe_window=256
low="full,pic,cacheblend,cacheblend:ratio=0.3,epic,epic:boundary_k=16,$old,rpdc:ratio=0.15:$o"
low="$low,$old:boundary_k=16,rpdc:ratio=0.15:$o:boundary_k=16,rpdc:ratio=0.15:$o:boundary_k=32"
high="full,epic,rpdc:ratio=0.5:$o,$old:boundary_k=32,rpdc:ratio=0.1:$o:boundary_k=64"
new="full,rpdc,rpdc:extra=0.1,rpdc:extra=0.5,rpdc:extra=1"
redo="full,rpdc,rpdc:probe_redo=true,rpdc:extra=0.5:probe_redo=true,rpdc:extra=1:probe_redo=true,epic"
offset="full,rpdc,rpdc:selection=offset,rpdc:selection=offset:extra=0.5,rpdc:selection=offset:extra=1,epic"
span=rpdc:selection=offset:chunks=span:per_chunk=64  # epic's token count, span offset order
count="full,epic,rpdc:selection=offset:per_chunk=64,$span,rpdc:per_chunk=64"
hybrid="full,epic,$span:boundary_k=4,$span:boundary_k=8,$span:boundary_k=16"
declare -A fill=(
  [swe_agent]="full,rpdc:selection=offset:extra=1.5,rpdc:extra=1.5:probe_redo=true"
  [reflexion]="full,rpdc:selection=offset:extra=0.7,rpdc:selection=offset:extra=0.8"
  [memgpt]="full,rpdc:selection=offset:extra=1.3,rpdc:selection=offset:extra=1.5"
)
for w in reflexion memgpt swe_agent; do
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$low" --out "docs/bench/frontier/$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$new" --out "docs/bench/frontier/new-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies full,cacheslide --out "docs/bench/frontier/cs-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$redo" --out "docs/bench/frontier/redo-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$offset" --out "docs/bench/frontier/offset-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "${fill[$w]}" --out "docs/bench/frontier/fill-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$count" --out "docs/bench/frontier/count-$w"
done
for w in reflexion memgpt; do
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$high" --out "docs/bench/frontier/hi-$w"
  $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
    --new-tokens 16 --strategies "$hybrid" --out "docs/bench/frontier/hybrid-$w"
done
.venv/bin/python benchmarks/frontier.py docs/bench/frontier/*/results.json --out docs/bench/frontier

# the perfect cache's ceiling over prefix caching, every session (about an hour)
$ac bench benchmarks/workloads/reflexion.jsonl benchmarks/workloads/memgpt.jsonl \
  benchmarks/workloads/swe_agent.jsonl --strategies full,prefix,pic,default --new-tokens 1 \
  --out docs/bench/ceiling/all
.venv/bin/python benchmarks/ceiling.py docs/bench/ceiling/all/results.json --out docs/bench/ceiling

# agentcache's full prefill against transformers' forward pass (about 20 minutes)
.venv/bin/python benchmarks/full_baseline.py benchmarks/workloads/reflexion.jsonl \
  benchmarks/workloads/memgpt.jsonl benchmarks/workloads/swe_agent.jsonl --out docs/bench/full-baseline
