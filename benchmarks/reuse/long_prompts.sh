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
threads=${THREADS:-2}

"${nice[@]}" $py benchmarks/reuse/prefill_profile.py --size 1000 --cases no-reuse,system+tools,history \
  --strategies full,prefix,rpdc --requests 2 --threads "$threads" --out "$out/profile"
"${nice[@]}" $py benchmarks/reuse/long_prompts.py --sizes "${SIZES:-4000:1,8000:1}" \
  --cases no-reuse,system,system+tools,history --strategies "${STRATEGIES:-full,prefix,rpdc}" \
  --server-strategies "${SERVER_STRATEGIES:-full,prefix,rpdc}" --threads "$threads" \
  --out "$out/${RUN:-sizes}"
