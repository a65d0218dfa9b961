#!/usr/bin/env bash
# Regenerates the exact-turn comparisons of docs/bench/long-prompts/findings.md ("Exact turns
# at prefix speed"): the default (`rpdc`) against `prefix` and `full` on long prompts (engine
# path; once with the tools block's first copy computed in the same context, once after
# another time stamp) and on validation sessions of the agent families whose warm turns are
# covered (exact); then the same pairs on the server path (`ChatEngine.complete`, every request
# committed, each repetition an equivalent request). Strategies alternate per request / per
# turn within each run.
#
#   bash benchmarks/reuse/exact_turns.sh          # tens of minutes on 2 shared cores
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PY:-.venv/bin/python}
ac=${AC:-.venv/bin/agentcache}
export PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1
out=docs/bench/long-prompts

nice -n 5 $py benchmarks/reuse/long_prompts.py --sizes 4000:2 --cases system+tools,history \
  --strategies full,prefix,rpdc --server-strategies "" --threads 1 --out "$out/exact-4k"
nice -n 5 $py benchmarks/reuse/long_prompts.py --sizes 4000:1 --cases no-reuse,system+tools,history \
  --strategies full,prefix,rpdc --server-strategies "" --threads 1 --out "$out/exact-4k-stamped"
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 4000 --reps 7 --threads 1 --out "$out/exact-pairs"
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 4000 --reps 5 --scenarios stamped --threads 1 \
  --out "$out/exact-pairs-ctxcopy"
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 8000 --reps 3 --scenarios stamped --threads 1 \
  --out "$out/exact-pairs-8k"
# every request paired: misses (every strategy against full) and hits (the default against prefix)
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 4000 --reps 5 --scenarios miss,fresh,stamped \
  --threads 1 --out "$out/paired-4k"
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 8000 --reps 4 --scenarios miss,fresh,stamped \
  --threads 1 --out "$out/paired-8k"
# the system prompt alone; paired-system-4k and -8k hold these runs before a changed segment's
# head was loaded (commit 4fe72c5), heads-system-4k and -8k after
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 4000 --reps 5 --scenarios fresh --hits system \
  --threads 1 --out "$out/heads-system-4k"
nice -n 5 $py benchmarks/reuse/exact_turns.py --size 8000 --reps 3 --scenarios fresh --hits system \
  --threads 1 --out "$out/heads-system-8k"
# the server path: each repetition an equivalent request on the same store state
nice -n 5 $py benchmarks/reuse/exact_turns.py --path server --size 4000 --reps 5 \
  --scenarios miss,fresh --threads 1 --out "$out/server-paired-4k"
nice -n 5 $py benchmarks/reuse/exact_turns.py --path server --size 4000 --reps 5 --scenarios fresh \
  --hits system --threads 1 --out "$out/server-paired-system-4k"
nice -n 5 $py benchmarks/reuse/exact_turns.py --path server --size 8000 --reps 3 \
  --scenarios miss,fresh --threads 1 --out "$out/server-paired-8k"
for w in ${FAMILIES:-memgpt swe_agent}; do
  nice -n 5 $ac bench "benchmarks/workloads/$w.jsonl" --split validate \
    --sessions "$w-08,$w-09" --max-turns "${TURNS:-4}" --new-tokens 8 \
    --strategies full,prefix,default --threads 1 --out "$out/exact-$w"
done
