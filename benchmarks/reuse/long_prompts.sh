#!/usr/bin/env bash
# Regenerates docs/bench/long-prompts/: the per-stage prefill profile (where the time goes) and
# the long-prompt runs (every strategy against `full` and `prefix`, engine and server path).
# Each writes results.json (with its provenance and the load average) and report.md. Run on a
# quiet machine: the measurement processes get `nice -n -5` (needs root; dropped otherwise).
#
#   bash benchmarks/reuse/long_prompts.sh            # minutes to tens of minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/../.."
py=".venv/bin/python"
nice=(nice -n -5)
[ "$(id -u)" = 0 ] || nice=()
export PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1
out=docs/bench/long-prompts

"${nice[@]}" $py benchmarks/reuse/prefill_profile.py --size 1000 --cases no-reuse,system+tools,history \
  --strategies full,prefix,rpdc --requests 2 --threads "${THREADS:-2}" --out "$out/profile"
# every case, every strategy and `full`, engine and server path, in one run (all-4k-8k: 1
# thread, about 80 minutes on 2 cores)
all=full,prefix,promptcache,pic,epic,cacheblend,cacheslide,rpdc
"${nice[@]}" $py benchmarks/reuse/long_prompts.py --sizes "${SIZES:-4000:2,8000:1}" \
  --strategies "${STRATEGIES:-$all}" --server-strategies "${SERVER_STRATEGIES:-$all}" \
  --threads "${THREADS:-1}" --out "$out/${RUN:-all-4k-8k}"
