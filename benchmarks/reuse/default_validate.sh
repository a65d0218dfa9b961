#!/usr/bin/env bash
# The default on the validation halves the README quotes: the agent families and chat (every
# warm turn of 4 sessions each) with full, prefix, epic and the transformers peer, and two runs
# of 4 generated sessions (4 turns each) with full and prefix; every strategy in one run, turn
# by turn, 1 torch thread. Two lanes, meant to run side by side on 2 cores:
#
#   bash benchmarks/reuse/default_validate.sh a OUT & bash benchmarks/reuse/default_validate.sh b OUT
#
# and `cold`: the first turn of all 8 validation sessions of every family (n = 32), `full`,
# `prefix` and the default, 4 new tokens each, then the targets read off the runs:
#
#   bash benchmarks/reuse/default_validate.sh cold OUT
#
# then copy OUT/* to docs/bench/default/ (the stored runs README.md and docs/benchmarks.md
# quote, "The default gains `cover_min=256`").
set -euo pipefail
lane=$1
out=$2
py=${PYTHON:-python}
agents=full,prefix,epic,default,transformers-prefix
family() {  # family, sessions
  nice -n 5 $py -m agentcache bench "benchmarks/workloads/$1.jsonl" --split validate \
    --sessions "$2" --strategies "$agents" --threads 1 --out "$out/validate-$1"
}
generated() {  # name, sessions
  nice -n 5 $py -m agentcache bench benchmarks/workloads/generated.jsonl --split validate \
    --sessions "$2" --max-turns 4 --strategies full,prefix,default --threads 1 \
    --out "$out/generated-$1"
}
case $lane in
  a)
    family memgpt memgpt-08,memgpt-09,memgpt-10,memgpt-11
    family swe_agent swe_agent-08,swe_agent-09,swe_agent-10,swe_agent-11
    generated a generated-16,generated-17,generated-18,generated-19
    ;;
  b)
    family reflexion reflexion-08,reflexion-09,reflexion-10,reflexion-11
    family chat chat-08,chat-09,chat-10,chat-11
    generated b generated-20,generated-21,generated-22,generated-23
    ;;
  cold)
    sessions=$(for w in reflexion memgpt swe_agent chat; do for i in 08 09 10 11 12 13 14 15; do
      printf "%s-%s," $w $i; done; done)
    nice -n 5 $py -m agentcache bench benchmarks/workloads/{reflexion,memgpt,swe_agent,chat}.jsonl \
      --split validate --sessions "${sessions%,}" --max-turns 1 --new-tokens 4 \
      --strategies full,prefix,default --threads 1 --out "$out/cold"
    $py benchmarks/reuse/targets.py "$out"/validate-{reflexion,memgpt,swe_agent,chat} \
      --cold "$out/cold" --out "$out/targets"
    ;;
  *) echo "lane: a, b or cold" >&2; exit 2 ;;
esac
