#!/usr/bin/env bash
# Regenerates docs/bench/planner/: the plan predictor fitted on tuning sessions' stored runs,
# its calibration on stored validation runs, and the planner against fixed strategies on
# validation sessions (interleaved per turn in one run per family).
#
#   bash benchmarks/reuse/planner/bench.sh            # fit + calibration (seconds) and runs (minutes)
set -euo pipefail
cd "$(dirname "$0")/../../.."
ac=.venv/bin/agentcache
py=.venv/bin/python
out=docs/bench/planner

$py benchmarks/reuse/planner/fit.py --out agentcache/reuse/planner/data/smollm2-135m-instruct.json
$py benchmarks/reuse/planner/calibration.py --out "$out/calibration.md"
# the model-read signals (a fresh pass over the first 4 layers per warm turn, 1 thread; a
# session already stored is not read again), then the cross-validation over every feature set
AGENTCACHE_NUM_THREADS=1 $py benchmarks/reuse/planner/reads.py --out "$out/attention-reads"
AGENTCACHE_NUM_THREADS=1 $py benchmarks/reuse/planner/reads.py --deviation --split tune \
  --out "$out/deviation-reads"
$py benchmarks/reuse/planner/signals.py --out "$out/signals.md"
# tuning data beyond the agent families: the approximate plans on generated sessions
$ac bench benchmarks/workloads/generated.jsonl --split tune --sessions generated-00,generated-01 \
  --max-turns 3 --new-tokens 8 --strategies pic,epic:exact_prefix=true,rpdc:cover=0,rpdc:extra=0.5 \
  --threads 1 --out "$out/tune-generated"
runs=()
for w in ${PLANNER_FAMILIES:-reflexion}; do
  n=$(printf '%s-08,%s-09' "$w" "$w")
  # reflexion was measured with --max-turns 4 --new-tokens 16, memgpt with 3 and 8
  turns=4 tokens=16
  [ "$w" = memgpt ] && turns=3 tokens=8
  $ac bench "benchmarks/workloads/$w.jsonl" --split validate --sessions "$n" --max-turns $turns \
    --new-tokens $tokens --strategies full,prefix,default,epic:exact_prefix=true,plan --threads 1 \
    --out "$out/validate-$w"
  runs+=("$out/validate-$w")
done
$py benchmarks/reuse/planner/report.py "${runs[@]}" --out "$out/report.md"
