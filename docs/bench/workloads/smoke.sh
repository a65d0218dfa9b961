#!/usr/bin/env bash
# One short bench run per kind of new workload (the chat path and the segment path), to show
# that `agentcache bench` runs them: one validation session, its first two turns, 1-2 new tokens
# (chat-fork's two are parent requests; chat-compact-05's second is a compaction).
# From the repository root; results land in docs/bench/workloads/<name>/.
set -euo pipefail
export PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1
PY=${PY:-.venv/bin/python}
$PY -m agentcache bench benchmarks/workloads/chat-fork.jsonl --strategies full,prefix,default \
  --split validate --sessions chat-fork-05 --max-turns 2 --new-tokens 2 \
  --out docs/bench/workloads/chat-fork
$PY -m agentcache bench benchmarks/workloads/chat-compact.jsonl --strategies full,prefix,default \
  --split validate --sessions chat-compact-05 --max-turns 2 --new-tokens 1 \
  --out docs/bench/workloads/chat-compact
$PY -m agentcache bench benchmarks/workloads/generated.jsonl --strategies full,prefix,default \
  --split validate --sessions generated-21 --max-turns 2 --new-tokens 1 \
  --out docs/bench/workloads/generated
