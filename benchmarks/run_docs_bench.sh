#!/usr/bin/env bash
# Reproduces the figures quoted in README.md, docs/benchmarks.md and docs/lab/*.md, by area:
#
#   bash benchmarks/run_docs_bench.sh AREA...     # reuse server vllm decode tiers cope, or all
#
# `make bench-<area>` calls it; `make bench` runs every area (hours on 2 CPU cores: not run in
# CI). Each area writes the folders under docs/bench/ its page links to. Afterwards,
# `python benchmarks/check_figures.py` names every quoted figure the new files no longer match.
# `rpdc` alone is the current default (extra=0.2, probe_window=128, cover=1.5); runs that
# measured earlier defaults name them in full: `rpdc:cover=0` (runs before cover, where the
# files say `rpdc`), `rpdc:ratio=0.3:probe_window=256` before that.
set -euo pipefail
cd "$(dirname "$0")/.."
ac=.venv/bin/agentcache
py=.venv/bin/python
vac=.venv-vllm/bin/agentcache  # the vLLM runs use their own venv (make test-vllm builds it)
W="reflexion memgpt swe_agent"

# docs/benchmarks.md "Reuse strategies", docs/lab/reuse.md (about 5 hours)
reuse() {
  # rpdc's cover, chosen on tuning sessions -00..-03 (docs/bench/tune-cover/cover.md). `rpdc`
  # there is rpdc without cover: run it again as rpdc:cover=0 and name that in the script
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split tune --sessions "$w-00,$w-01,$w-02,$w-03" \
      --strategies full,prefix,rpdc:cover=0 --threads 1 --out "docs/bench/tune-cover/$w"
  done
  $py benchmarks/reuse/cover_choice.py docs/bench/tune-cover/{reflexion,memgpt,swe_agent} \
    --uncovered rpdc:cover=0 --out docs/bench/tune-cover/cover.md
  # the agent families' validation halves (docs/benchmarks.md "Validation sessions")
  $ac bench benchmarks/workloads/reflexion.jsonl --split validate \
    --sessions reflexion-08,reflexion-09,reflexion-10,reflexion-11 \
    --strategies full,prefix,pic,epic,cacheblend,cacheslide,default,rpdc:cover=0,transformers-prefix \
    --threads 1 --out docs/bench/validate-reflexion
  for w in memgpt swe_agent; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split validate --sessions "$w-08,$w-09,$w-10,$w-11" \
      --strategies full,prefix,pic,epic,cacheblend,default,rpdc:cover=0,transformers-prefix \
      --threads 1 --out "docs/bench/validate-$w"
  done
  # the chat family's validation half, through the server's segmenter, with the transformers peer
  $ac bench benchmarks/workloads/chat.jsonl --split validate --sessions chat-08,chat-09,chat-10,chat-11 \
    --strategies full,prefix,pic,epic,cacheblend,default,transformers-prefix --threads 1 \
    --out docs/bench/validate-chat
  # cold turns: the first turn of all 8 validation sessions of every family, every strategy
  sessions=$(for w in reflexion memgpt swe_agent chat; do for i in 08 09 10 11 12 13 14 15; do
    printf "%s-%s," $w $i; done; done)
  $ac bench benchmarks/workloads/{reflexion,memgpt,swe_agent,chat}.jsonl --split validate \
    --sessions "${sessions%,}" --max-turns 1 --new-tokens 4 \
    --strategies full,prefix,promptcache,pic,epic,cacheblend,cacheslide,default,transformers-prefix \
    --threads 1 --out docs/bench/cold
  # the default against its targets (docs/benchmarks.md "Against the targets")
  $py benchmarks/reuse/targets.py docs/bench/validate-{reflexion,memgpt,swe_agent,chat} \
    --cold docs/bench/cold --out docs/bench/targets
  # today's default on the validation halves README quotes, two lanes side by side, then its
  # cold turns and targets (docs/benchmarks.md "The default gains `cover_min=256`")
  PYTHON=$py bash benchmarks/reuse/default_validate.sh a docs/bench/default &
  PYTHON=$py bash benchmarks/reuse/default_validate.sh b docs/bench/default
  wait
  PYTHON=$py bash benchmarks/reuse/default_validate.sh cold docs/bench/default
  # where the default's floor acts: plans only, every validation session (a few minutes)
  $py benchmarks/reuse/cover_min_plans.py \
    benchmarks/workloads/{memgpt,reflexion,swe_agent,chat,generated}.jsonl \
    benchmarks/workloads/chat-{edit,sysprompt,compact,retry,fork}.jsonl \
    --split validate --floor rpdc:cover_min=256 --out docs/bench/cover-min/validate
  # the top of the range the tuning counts allow (docs/benchmarks.md "Where in that range"):
  # the same replay with cover_min=384, both splits
  for split in tune validate; do
    $py benchmarks/reuse/cover_min_plans.py \
      benchmarks/workloads/{memgpt,reflexion,swe_agent,chat,generated}.jsonl \
      benchmarks/workloads/chat-{edit,sysprompt,compact,retry,fork}.jsonl \
      --split $split --floor rpdc:cover_min=384 --out docs/bench/cover-min/at-384/$split
  done
  # docs/templates.md: the templated workload, one session per shipped template (a few minutes)
  $ac bench benchmarks/workloads/templated.jsonl --strategies prefix,default \
    --max-turns 2 --new-tokens 4 --threads 1 --out docs/bench/templated
  # every strategy, sessions -01 (shift) and -02 (swing), first 4 turns, 32 teacher-forced tokens
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
      --out "docs/bench/$w"
  done
  # the default against full recompute and pic on every session and turn (~40 min)
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split tune --strategies full,pic,rpdc:cover=0 \
      --out "docs/bench/wide-$w"
  done
  # the default with the probe shortcut on every swe_agent turn (~25 min)
  $ac bench benchmarks/workloads/swe_agent.jsonl --split tune --strategies full,rpdc:cover=0 \
    --out docs/bench/shortcut-swe_agent
  # larger budgets and epic on the same turns: greedy exact match against TTFT (~60 min)
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split tune \
      --strategies full,rpdc:extra=0.5,rpdc:extra=1:probe_redo=true,epic --out "docs/bench/wide-budget-$w"
  done
  $py benchmarks/reuse/budget_curve.py docs/bench/wide-*/results.json --out docs/bench/wide-budget-curve
  # docs/benchmarks.md "Chunk starts on the exact turns": a rule replayed on the stored tuning
  # (tune-cover, wide-budget) and validation runs above
  $py benchmarks/reuse/covered_epic.py --uncovered rpdc:cover=0 \
    --out docs/bench/planner/covered-epic
  # rpdc's floor in the stale tokens (docs/benchmarks.md "A floor in the stale tokens"):
  # min_ratio chosen or not on the chat edit families' tuning sessions, then reported on
  # chat-sysprompt's validation sessions
  $ac bench benchmarks/workloads/chat-sysprompt.jsonl benchmarks/workloads/chat-edit.jsonl \
    --strategies full,prefix,default,rpdc:min_ratio=0.1,rpdc:min_ratio=0.25 --split tune \
    --max-turns 4 --threads 2 --out docs/bench/planner/min-ratio/tune
  $ac bench benchmarks/workloads/chat-sysprompt.jsonl \
    --strategies full,prefix,default,rpdc:min_ratio=0.1 --split validate --max-turns 4 \
    --threads 2 --out docs/bench/planner/min-ratio/validate
  # chat-edit's parting turns with every candidate computed, then cover_min=256 (read off the
  # tuning run's candidate counts) on chat-edit's validation sessions
  $ac bench benchmarks/workloads/chat-edit.jsonl --sessions chat-edit-00,chat-edit-02 \
    --strategies full,default,rpdc:min_ratio=0.5,rpdc:min_ratio=1,rpdc:cover=100,epic \
    --max-turns 3 --threads 2 --out docs/bench/planner/min-ratio/tune-misses
  $ac bench benchmarks/workloads/chat-edit.jsonl \
    --strategies full,prefix,default,rpdc:cover_min=256 --split validate --max-turns 4 \
    --threads 2 --out docs/bench/planner/min-ratio/cover-min-validate
  # the edit families on every turn of their validation sessions, the memory sessions' budgets
  # on tuning, and the targets split by edit (docs/benchmarks.md "Edited histories on every
  # validation turn"; ~75 min on 2 cores)
  bash benchmarks/reuse/edit_families.sh wide wide-extra wide-memory wide-targets
  # a floor per moved message (boundary_k, then starts) on the memory tuning sessions beside
  # memgpt's, then starts=16 on validation sessions (docs/benchmarks.md "A floor per moved
  # message"; ~45 min on 2 cores)
  bash benchmarks/reuse/edit_families.sh starts starts-validate exact-history
  # chunk starts where the budget is thin (`epic_over`): tuning runs, the ratio chosen on
  # them, its validation runs and every session's plans (docs/benchmarks.md "Chunk starts where
  # the budget is thin"; ~45 min on 2 cores)
  bash benchmarks/reuse/edit_families.sh epic-over-tune epic-over-validate epic-over-choice \
    epic-over-plans
  # the generated family (docs/benchmarks.md "Generated sessions"): every strategy and the
  # planner on 4 tuning and 4 validation sessions, 4 turns each (the two runs side by side,
  # one per core); the fixed strategy the tuning run picks (fastest at the floor) read on the
  # validation run beside the default
  s=full,prefix,promptcache,pic,cacheblend,epic,cacheslide,default,transformers-prefix
  s=$s,rpdc:cover=0,rpdc:extra=0.5,plan
  $ac bench benchmarks/workloads/generated.jsonl --split tune \
    --sessions generated-00,generated-01,generated-02,generated-03 --max-turns 4 \
    --strategies $s --threads 1 --out docs/bench/generated/tune
  $ac bench benchmarks/workloads/generated.jsonl --split validate \
    --sessions generated-16,generated-17,generated-18,generated-19 --max-turns 4 \
    --strategies $s --threads 1 --out docs/bench/generated/validate
  $py benchmarks/reuse/tuned_choice.py --tune docs/bench/generated/tune \
    --validate docs/bench/generated/validate --out docs/bench/generated/choice
  # four more validation sessions, with `plan` costed by its plans' work (format version 2)
  $ac bench benchmarks/workloads/generated.jsonl --split validate \
    --sessions generated-20,generated-21,generated-22,generated-23 --max-turns 4 \
    --strategies "${s/,transformers-prefix/}" --threads 1 --out docs/bench/generated/validate-b
  $py benchmarks/reuse/tuned_choice.py --tune docs/bench/generated/tune \
    --validate docs/bench/generated/validate-b --out docs/bench/generated/choice-b
  $py benchmarks/reuse/exact_turn_kinds.py docs/bench/generated/validate \
    docs/bench/generated/validate-b --out docs/bench/generated/exact-turns
  # every strategy of the validation runs on the agent and chat families' tuning sessions
  # -00..-03 (5 turns each; reflexion and memgpt side by side, then swe_agent beside chat),
  # and the fixed strategy each tuning run picks (fastest at the floor), read on the stored
  # validation runs beside the default: per family, and pooled over the agent families
  # (docs/benchmarks.md "A fixed strategy chosen on tuning")
  a=full,prefix,pic,epic,cacheblend,cacheslide,default,rpdc:cover=0,transformers-prefix
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split tune --sessions "$w-00,$w-01,$w-02,$w-03" \
      --max-turns 5 --strategies $a --threads 1 --out "docs/bench/tuned/tune-$w"
  done
  $ac bench benchmarks/workloads/chat.jsonl --split tune --sessions chat-00,chat-01,chat-02,chat-03 \
    --strategies full,prefix,pic,epic,cacheblend,default,transformers-prefix --threads 1 \
    --out docs/bench/tuned/tune-chat
  for w in $W; do
    $py benchmarks/reuse/tuned_choice.py --tune "docs/bench/tuned/tune-$w" --family "$w" \
      --validate "docs/bench/validate-$w" --out "docs/bench/tuned/$w"
  done
  # chat only appends: there the target is no slower than prefix reuse (<= 1.01x)
  $py benchmarks/reuse/tuned_choice.py --tune docs/bench/tuned/tune-chat --family chat \
    --validate docs/bench/validate-chat --vs-prefix 1.01 --out docs/bench/tuned/chat
  for w in $W; do
    $py benchmarks/reuse/tuned_choice.py --tune docs/bench/tuned/tune-{reflexion,memgpt,swe_agent} \
      --validate "docs/bench/validate-$w" --out "docs/bench/tuned/pooled-$w"
  done
  # `cover` replayed on those tuning runs picks 2 (docs/bench/tuned/cover.md): rpdc:cover=2
  # beside the default on the agent families' validation sessions (the three runs side by side)
  $py benchmarks/reuse/cover_choice.py docs/bench/tuned/tune-{reflexion,memgpt,swe_agent} \
    --uncovered rpdc:cover=0 --out docs/bench/tuned/cover.md
  $py benchmarks/reuse/exact_turn_kinds.py docs/bench/tuned/tune-{reflexion,memgpt,swe_agent} \
    --out docs/bench/tuned/exact-turns
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split validate --sessions "$w-08,$w-09,$w-10,$w-11" \
      --strategies full,prefix,default,rpdc:cover=2 --threads 1 --out "docs/bench/tuned/cover2-$w"
  done
  # `cover` replayed on the generated tuning turns (the rule of tune-cover/cover.md)
  $py benchmarks/reuse/cover_choice.py docs/bench/generated/tune --uncovered rpdc:cover=0 \
    --out docs/bench/generated/cover.md
  # ... and the cover it picks there (2), on the validation sessions -16..-23
  $ac bench benchmarks/workloads/generated.jsonl --split validate \
    --sessions generated-16,generated-17,generated-18,generated-19,generated-20,generated-21,generated-22,generated-23 \
    --max-turns 4 --strategies full,prefix,default,rpdc:cover=2,epic --threads 1 \
    --out docs/bench/generated/cover2-validate
  # where greedy decoding parts from full's (docs/lab/reuse.md, "Where greedy decoding parts")
  $py benchmarks/reuse/greedy_margins.py docs/bench/wide-reflexion/results.json \
    --strategies pic,rpdc --out docs/bench/wide-reflexion/margins.md
  # budget/ablation sweep on one swing session, 16 tokens
  $ac bench benchmarks/workloads/reflexion.jsonl --sessions reflexion-02 --max-turns 4 \
    --new-tokens 16 --sweep --strategies full,pic,cacheblend,epic,cacheslide,rpdc:cover=0 \
    --out docs/bench/sweep
  # boundary-token ablation of the earlier default (docs/lab/reuse.md, "Boundary tokens")
  old=rpdc:ratio=0.3:probe_window=256
  for w in $W; do
    $ac bench "benchmarks/workloads/$w.jsonl" --sessions "$w-01,$w-02" --max-turns 4 \
      --new-tokens 16 --strategies "full,$old,$old:boundary_k=16" --out "docs/bench/boundary-$w"
  done
  # fidelity at matched compute (docs/lab/reuse.md, "Fidelity at matched compute"); ~2 hours
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
  for w in $W; do
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
  $py benchmarks/reuse/frontier.py docs/bench/frontier/*/results.json --out docs/bench/frontier
  # the default's exact turns against prefix's (docs/benchmarks.md "Exact turns at prefix's
  # cost"); the swe_agent and memgpt runs ran side by side, memgpt-alone by itself (about 20
  # minutes each)
  for w in swe_agent memgpt; do
    $ac bench "benchmarks/workloads/$w.jsonl" --split validate --sessions "$w-08,$w-09,$w-10,$w-11" \
      --strategies full,prefix,default,transformers-prefix --threads 1 --out "docs/bench/exact-turns/$w"
  done
  $ac bench benchmarks/workloads/memgpt.jsonl --split validate \
    --sessions memgpt-08,memgpt-09,memgpt-10,memgpt-11 --strategies full,prefix,default,transformers-prefix \
    --threads 1 --out docs/bench/exact-turns/memgpt-alone
  $py benchmarks/reuse/exact_turn_kinds.py docs/bench/validate-swe_agent docs/bench/exact-turns/swe_agent \
    docs/bench/validate-memgpt docs/bench/exact-turns/{memgpt,memgpt-alone} --out docs/bench/exact-turns
  # agentcache's full prefill against transformers' forward pass (about 20 minutes)
  $py benchmarks/reuse/full_baseline.py benchmarks/workloads/reflexion.jsonl \
    benchmarks/workloads/memgpt.jsonl benchmarks/workloads/swe_agent.jsonl --out docs/bench/full-baseline
  # long prompts (4k tokens, mostly a tools block): misses and hits against full and prefix,
  # engine and server path (about 1 hour on a busy 2-core machine; every strategy and 8k
  # prompts with --strategies and --sizes 4000:2,8000:1 where time allows)
  local lp="env HF_HUB_OFFLINE=1 PYTHONPATH=.:templates:adapters $py benchmarks/reuse/long_prompts.py"
  # (the stored run of this one was stopped after its no-reuse request)
  $lp --sizes 4000:1 --cases no-reuse,system+tools,history,system --strategies full,prefix,rpdc \
    --server-strategies full,prefix,rpdc --threads 1 --out docs/bench/long-prompts
  $lp --sizes 4000:1 --cases system+tools,history --strategies prefix,rpdc \
    --server-strategies prefix,rpdc --threads 1 --out docs/bench/long-prompts/hits
  $lp --sizes 4000:2 --cases no-reuse,system+tools,history,system,history-stamp \
    --strategies full,prefix,rpdc --server-strategies "" --threads 1 \
    --out docs/bench/long-prompts/engine-4k
}

# docs/benchmarks.md "The OpenAI-compatible server", docs/lab/server.md (about 5 minutes)
server() {
  $py benchmarks/server/openai_loop.py --out docs/bench/openai-loop \
    --turns 8 --max-tokens 24 --loops 8 --loop-turns 6
  # replies through the openai client against --strategy full, chat validation tool-use sessions
  $py benchmarks/server/fidelity.py --sessions chat-09,chat-11,chat-13,chat-15 --max-tokens 32 \
    --threads 1 --out docs/bench/server/fidelity-tool-use
  # a reply budget that closes every tool call (the run above compares 5 of 24 replies)
  $py benchmarks/server/fidelity.py --sessions chat-09,chat-11,chat-13,chat-15 --max-tokens 160 \
    --threads 1 --out docs/bench/server/fidelity-tool-use-160
  # docs/benchmarks.md "Edited histories": append-only bfcl conversations in no workload file,
  # each step to a default and a --strategy prefix server in one run
  $py benchmarks/server/append.py --conversations 4 --steps 6 --max-tokens 128 --no-full \
    --out docs/bench/server/append-only-copies
  # the same at the commit that stores repeated texts at each place (docs/benchmarks.md)
  $py benchmarks/server/append.py --conversations 4 --steps 6 --max-tokens 128 --no-full \
    --out docs/bench/server/append-only-repeats
  # the same with today's default (cover_min=256; docs/benchmarks.md "The default gains")
  $py benchmarks/server/append.py --conversations 4 --steps 6 --max-tokens 128 --no-full \
    --out docs/bench/server/append-only-floor
  # again with today's default (epic_over=4; docs/benchmarks.md), and the MemGPT-style openai
  # loop under it (docs/server.md)
  $py benchmarks/server/append.py --conversations 4 --steps 6 --max-tokens 128 --no-full \
    --out docs/bench/server/append-only-epic
  $py benchmarks/server/edits.py --out docs/bench/server/memgpt-client-epic
  # docs/server.md "Under load" (about 100 minutes): first one request at a time at the engine
  export AGENTCACHE_NUM_THREADS=1
  $py benchmarks/server/load.py --clients 8 --duration 60 --model tiny --max-active 1 \
    --out docs/bench/server/load-tiny-8x60
  $py benchmarks/server/load.py --clients 16 --duration 240 --model tiny --max-active 1 \
    --out docs/bench/server/load-tiny-16x240
  $py benchmarks/server/load.py --clients 16 --duration 300 --model tiny --store-bytes 33554432 \
    --max-active 1 --out docs/bench/server/load-tiny-16x300-store32m
  $py benchmarks/server/load.py --clients 16 --duration 300 --think 1.0 --model tiny \
    --store-bytes 33554432 --max-active 1 --out docs/bench/server/load-tiny-16x300-think1
  # then the engine interleaving requests, 4 and 16 at once (16 is the default), against one
  # at a time, same settings; a 15-minute run at 4 and a 30-minute run at 16 for memory
  for active in 4 1 16; do
    $py benchmarks/server/load.py --clients 16 --duration 300 --think 1.0 --model tiny \
      --store-bytes 33554432 --conversation-bytes 8388608 --max-active $active \
      --out docs/bench/server/load-tiny-16x300-think1-active$active
  done
  $py benchmarks/server/load.py --clients 16 --duration 900 --think 1.0 --model tiny \
    --store-bytes 33554432 --conversation-bytes 8388608 --max-active 4 \
    --out docs/bench/server/load-tiny-16x900-think1-active4
  $py benchmarks/server/load.py --clients 16 --duration 1800 --think 1.0 --model tiny \
    --store-bytes 33554432 --conversation-bytes 8388608 --max-active 16 \
    --out docs/bench/server/load-tiny-16x1800-think1-active16
  # (every run above was taken before the server trimmed its heap and before the store's record
  # of evicted keys was cut to 8192; run now they trim every 10 s)
  # memory with and without the heap trimmer, 10 minutes each, both at once (same contention)
  for trim in 10 0; do
    $py benchmarks/server/load.py --clients 16 --duration 600 --think 1.0 --model tiny \
      --store-bytes 33554432 --conversation-bytes 8388608 --max-active 16 --trim-interval $trim \
      --out docs/bench/server/load-tiny-16x600-think1-active16-trim$trim &
  done
  wait
  # the server in a process of its own, glibc's arenas against 2 (serve's default since), 20
  # minutes each, both at once: resident memory once the store and the tracker are full
  for arenas in 0 2; do
    $py benchmarks/server/load.py --clients 16 --duration 1200 --think 1.0 --model tiny \
      --store-bytes 33554432 --conversation-bytes 8388608 --max-active 16 --server process \
      --malloc-arenas $arenas --out docs/bench/server/load-tiny-16x1200-think1-active16-process-arenas$arenas &
  done
  wait
  # the engine as agentcache serve runs it: decode batched, prefills in bursts
  AGENTCACHE_NUM_THREADS=1 $py benchmarks/server/load.py --clients 16 --duration 240 \
    --think 1.0 --model tiny --store-bytes 33554432 --max-active 16 --batch-decode \
    --out docs/bench/server/load-tiny-16x240-think1-batched
  # docs/server.md "Batched decode": a decode step's matrix products and the whole step at 1 to
  # 16 rows, the bound on 16 agents' aggregate decode against one (1 and 2 threads)
  for t in 1 2; do
    $py benchmarks/server/step_bound.py --rows 1 4 8 16 --threads $t --repeats 30 \
      --out docs/bench/server/step-bound/smollm2-t$t
  done
  # docs/server.md "Batched decode": the same on the 2-core AMD EPYC, 1 thread
  $py benchmarks/server/step_bound.py --rows 1 4 8 16 --threads 1 --repeats 30 \
    --out docs/bench/server/step-bound/epyc-t1
  # docs/server.md "Batched decode": one call of 16 to 32 rows (this CPU's call rule)
  $py benchmarks/server/step_bound.py --rows 1 16 24 32 --threads 1 --repeats 30 \
    --out docs/bench/server/step-bound/smollm2-t1-calls
  # docs/server.md "Batched decode at a fixed KV budget": 12 agents on one 4k document, the
  # same pool (4 dense requests' pages) for dense and sparse decode
  $py benchmarks/server/kv_budget.py --agents 12 --context 4096 --budget-turns 4 \
    --policies dense,flexicache,flexicache:verify=8 --repeats 3 \
    --profile docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json \
    --out docs/bench/server/kv-budget/smollm2-ctx4096
  $py benchmarks/server/kv_budget.py --agents 12 --context 4096 --budget-turns 4 \
    --policies dense,flexicache,flexicache:verify=8 --repeats 3 --threads 2 \
    --profile docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json \
    --out docs/bench/server/kv-budget/smollm2-ctx4096-t2
  $py benchmarks/server/kv_budget.py --agents 12 --context 8192 --budget-turns 4 \
    --policies dense,flexicache,flexicache:verify=8 --repeats 3 \
    --profile docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json \
    --out docs/bench/server/kv-budget/smollm2-ctx8192
  # (kv-budget/setup-in-place/ holds these three commands run again at 7032937; calls-of-16/ and
  # one-token-per-step/ the same at 3375b8d and c427000)
  # docs/server.md "Every head offloaded": quest:interval=16:verify=8 beside flexicache:verify=8,
  # on another document (reflexion's texts) and on this one at 4k and 8k; then alone at 4k
  local q=dense,flexicache:verify=8,quest:interval=16:verify=8
  local hp=docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json
  $py benchmarks/server/kv_budget.py --agents 12 --context 4096 --budget-turns 4 --policies $q \
    --repeats 3 --profile $hp --workload benchmarks/workloads/reflexion.jsonl \
    --out docs/bench/server/kv-budget/quest-tune-reflexion-ctx4096
  for ctx in 4096 8192; do
    $py benchmarks/server/kv_budget.py --agents 12 --context $ctx --budget-turns 4 --policies $q \
      --repeats 3 --profile $hp --out docs/bench/server/kv-budget/quest-ctx$ctx
  done
  $ac bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 --context 4096 \
    --new-tokens 64 --num-prompts 4 --no-teacher-forced --profile $hp --policies $q \
    --out docs/bench/decode/quest-alone-ctx4096
  # docs/server.md "Pages held in common": the same 12 agents, dense decoding on an engine whose
  # requests hold the document's pages once (dense+shared), beside dense and
  # flexicache:verify=8 without it, at 4k and 8k
  $py benchmarks/server/kv_budget.py --agents 12 --context 4096 --budget-turns 4 \
    --policies dense,dense+shared,flexicache:verify=8 --repeats 3 --profile $hp \
    --out docs/bench/server/kv-budget/shared-ctx4096
  $py benchmarks/server/kv_budget.py --agents 12 --context 8192 --budget-turns 4 \
    --policies dense,dense+shared --repeats 3 --out docs/bench/server/kv-budget/shared-ctx8192
  # docs/server.md "Where the time goes": the quest runs again, each run's time split by part,
  # and the 8k sharing run the same way
  for ctx in 4096 8192; do
    $py benchmarks/server/kv_budget.py --agents 12 --context $ctx --budget-turns 4 --policies $q \
      --repeats 3 --profile $hp --out docs/bench/server/kv-budget/time-ctx$ctx
  done
  $py benchmarks/server/kv_budget.py --agents 12 --context 8192 --budget-turns 4 \
    --policies dense,dense+shared --repeats 3 --out docs/bench/server/kv-budget/time-shared-ctx8192
  # docs/server.md "Replaying concurrent agents": agents with tool pauses over HTTP, the default
  # model, 1 thread per server (the vLLM targets need .venv-vllm: make .venv-vllm/.installed)
  local r=docs/bench/server/replay common="--model default --threads 1 --pause-median 2 --seed 0"
  $py benchmarks/server/replay.py --split validate --n 4 --clients 1,4 \
    --targets embedded,embedded-prefix $common --max-tokens 16 --out $r/validate-4x2
  # (plain vLLM with the model's own chat template, as that run had it: other prompts)
  $py benchmarks/server/replay.py --split all --clients 1,16 \
    --targets vllm,vllm-backend,embedded --vllm-python .venv-vllm/bin/python $common \
    --vllm-chat-template model --max-tokens 32 --out $r/all-16x32
  # every target sent the same prompts (plain vLLM with the server's chat template); the
  # second after the engine's lock change (a separate run)
  $py benchmarks/server/replay.py --split all --clients 1,16 \
    --targets vllm,vllm-backend,embedded --target-args 'vllm-backend=--max-active 16' \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-template
  $py benchmarks/server/replay.py --split all --clients 16 --targets vllm,embedded \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 \
    --out $r/all-16x32-template-after
  # a scheduling setting chosen on the tuning sessions and reported on the validation
  # sessions: 8 agents at once, one server per value; `embedded@NAME=FLAGS` per value
  choose() {
    local split=$1 name=$2 flag=$3 targets=() args=()
    shift 3
    for v in "$@"; do
      targets+=("embedded@${v%%=*}")
      args+=(--target-args "embedded@${v%%=*}=$flag ${v#*=}")
    done
    $py benchmarks/server/replay.py --split "$split" --clients 8 \
      --targets "$(IFS=,; echo "${targets[*]}")" "${args[@]}" $common --max-tokens 32 \
      --out "$r/$split-8x32-$name"
  }
  # prefill order (measured with one prefill per decode step, the scheduling before bursts)
  choose tune prefill-order --prefill-order "arrival=arrival --prefill-burst-tokens 0" \
    "shortest=shortest --prefill-burst-tokens 0"
  choose validate prefill-order --prefill-order "arrival=arrival --prefill-burst-tokens 0" \
    "shortest=shortest --prefill-burst-tokens 0"
  # prefill bursts between decode steps
  choose tune prefill-burst --prefill-burst-tokens b0=0 b512=512 b2048=2048
  choose validate prefill-burst --prefill-burst-tokens b0=0 b2048=2048
  # the vLLM backend's admission by tokens (its default) against admission left to vLLM
  $py benchmarks/server/replay.py --split all --clients 16 \
    --targets vllm,vllm-backend,vllm-backend@ungated \
    --target-args 'vllm-backend@ungated=--max-active 256 --max-active-tokens 1000000000' \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-token-gate
  # the same against plain vLLM alone (at 80322ce), then with shared prompt prefixes counted
  # once in the bound (two rounds), then with one tenant allowed every token of the bound
  $py benchmarks/server/replay.py --split all --clients 16 --targets vllm,vllm-backend \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-loaded
  $py benchmarks/server/replay.py --split all --clients 16 --rounds 2 --targets vllm,vllm-backend \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-shared-prefix
  $py benchmarks/server/replay.py --split all --clients 16 \
    --targets vllm,vllm-backend,vllm-backend@whole-share \
    --target-args 'vllm-backend@whole-share=--max-active-per-tenant 256' \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-tenant-share
  # the default again once a tenant alone may hold every token (at e62a348), two rounds
  $py benchmarks/server/replay.py --split all --clients 16 --rounds 2 --targets vllm,vllm-backend \
    --vllm-python .venv-vllm/bin/python $common --max-tokens 32 --out $r/all-16x32-lone-tenant
  # ... and the same agents as four tenants (cache_salt by session, at ecf55e5)
  $py benchmarks/server/replay.py --split all --clients 16 --rounds 2 --tenants 4 \
    --targets vllm,vllm-backend --vllm-python .venv-vllm/bin/python $common --max-tokens 32 \
    --out $r/all-16x32-four-tenants
  $py benchmarks/server/replay.py --split all --clients 16 \
    --targets embedded-prefix,embedded@isolated \
    --target-args 'embedded@isolated=--isolate-conversations' $common --max-tokens 32 \
    --out $r/all-16x32-scopes
  # a store holding about a quarter of 8 agents' KV (sizes: benchmarks/server/session_kv.py)
  $py benchmarks/server/replay.py --split validate --clients 8 --rounds 2 $common \
    --max-tokens 32 --targets embedded@drop,embedded@tiers \
    --target-args 'embedded@drop=--kv-pages 321 --store-bytes 226MiB --retention-share 0' \
    --target-args 'embedded@tiers=--kv-pages 321 --store-bytes 226MiB --store-host-bytes 1GiB' \
    --out $r/store-pressure-8x2
  # the vLLM backend with its KV memory cut to the longest session (about a third of 8 agents'):
  # vLLM's prefix cache alone against the connector's folder, and a bounded folder without and
  # with pins (the vLLM targets need .venv-vllm: make .venv-vllm/.installed)
  local vkv='--kv-bytes 272MiB --max-model-len 6144'
  $py benchmarks/server/replay.py --split validate --clients 8 --rounds 2 $common \
    --max-tokens 32 --targets vllm-backend@prefix,vllm-backend@folder \
    --vllm-python .venv-vllm/bin/python \
    --target-args "vllm-backend@prefix=$vkv --vllm-reuse prefix" \
    --target-args "vllm-backend@folder=$vkv" --out $r/vllm-kv-pressure-8x2-loaded
  $py benchmarks/server/replay.py --split validate --clients 8 --rounds 2 $common \
    --max-tokens 32 --targets vllm-backend@drop,vllm-backend@pins \
    --vllm-python .venv-vllm/bin/python \
    --target-args "vllm-backend@drop=$vkv --vllm-folder-bytes 226MiB --retention-share 0" \
    --target-args "vllm-backend@pins=$vkv --vllm-folder-bytes 226MiB" \
    --out $r/vllm-store-pressure-8x2-loaded
}

# docs/benchmarks.md "vLLM", docs/lab/vllm.md (vllm-staged alone about 2 hours)
vllm() {
  local slice=(benchmarks/workloads/reflexion.jsonl benchmarks/workloads/swe_agent.jsonl
    --sessions reflexion-00,reflexion-01,swe_agent-01 --max-turns 3 --backend vllm
    --strategies rpdc:ratio=0.3:probe_window=256,pic)
  $vac bench "${slice[@]}" --out docs/bench/vllm
  $vac bench "${slice[@]}" --threads 1 --out docs/bench/vllm-threads1
  $vac bench benchmarks/workloads/reflexion.jsonl benchmarks/workloads/swe_agent.jsonl \
    --sessions reflexion-00,reflexion-01,swe_agent-01 --max-turns 3 --backend vllm \
    --strategies rpdc:cover=0,pic --threads 1 --out docs/bench/vllm-current
  # validation sessions, configurations in rotated rounds (pairs within a round)
  $vac bench benchmarks/workloads/reflexion.jsonl benchmarks/workloads/swe_agent.jsonl \
    --split validate --sessions reflexion-08,reflexion-09,swe_agent-08 --max-turns 3 \
    --backend vllm --strategies rpdc,pic --rounds 2 --threads 1 --out docs/bench/vllm-validate
  $vac bench benchmarks/workloads/memgpt.jsonl --sessions memgpt-01,memgpt-02 \
    --max-turns 3 --backend vllm --strategies rpdc:cover=0,pic --threads 1 \
    --out docs/bench/vllm-memgpt
  $vac bench benchmarks/workloads/reflexion.jsonl benchmarks/workloads/memgpt.jsonl \
    benchmarks/workloads/swe_agent.jsonl --split tune --backend vllm \
    --strategies pic,pic@vllm,rpdc:cover=0 --threads 1 --out docs/bench/vllm-staged
  # the perfect cache's ceiling over prefix caching, every session (about an hour)
  $ac bench benchmarks/workloads/reflexion.jsonl benchmarks/workloads/memgpt.jsonl \
    benchmarks/workloads/swe_agent.jsonl --split tune --strategies full,prefix,pic,rpdc:cover=0 \
    --new-tokens 1 --out docs/bench/ceiling/all
  $py benchmarks/reuse/ceiling.py docs/bench/ceiling/all/results.json --out docs/bench/ceiling
}

# docs/benchmarks.md "Sparse decode", docs/lab/decode.md
decode() {
  local d=docs/bench/decode
  $ac profile-heads --threads 1
  $ac bench-decode --threads 1 --context 8192 --new-tokens 256 \
    --policies dense,flexicache,multiscale --needle 16 --out $d/ctx8192
  $ac bench-decode --threads 1 --context 4096 --new-tokens 256 \
    --policies dense,quest,flexicache,multiscale --needle 16 --out $d/ctx4096
  $ac bench-decode --threads 1 --context 8192 --new-tokens 64 --policies dense,quest \
    --budget 509 --no-teacher-forced --out $d/ctx8192-fullbudget  # 509 pages: the whole context
  for b in 128 96; do
    $ac bench-decode --threads 1 --context 8192 --new-tokens 256 --policies dense,flexicache \
      --budget $b --out $d/ctx8192-budget$b
  done
  $ac bench-decode --threads 1 --context 8192 --new-tokens 256 --needle 16 \
    --policies dense,flexicache,multiscale,flexicache:verify=8,flexicache:verify=16,multiscale:verify=16 \
    --out $d/ctx8192-verify
  # dense decode read in place against transformers' generate, then the policies against it on
  # 4 workload + 4 needle prompts at 4k and 8k (docs/decode.md)
  $ac bench-dense-decode --threads 1 --contexts 1024,4096,8192 --new-tokens 32 --num-prompts 3 \
    --out $d/dense
  for ctx in 4096 8192; do
    $ac bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 --context $ctx \
      --new-tokens 32 --num-prompts 4 --needle-prompts 4 \
      --policies dense,flexicache,flexicache:verify=8 --out $d/policies-ctx$ctx
  done
  # top-p and streaming heads against fixed top-K at 4k (docs/decode.md "Top-p and streaming
  # heads"), on the stored profile (its model id in the current weights-digest form): top_p and
  # the streaming options picked on 2 essay prompts, then measured on the workload and needles
  local p=$d/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json
  $ac bench-decode --threads 1 --context 4096 --new-tokens 32 --num-prompts 2 --profile $p \
    --policies dense,flexicache,flexicache:top_p=0.95,flexicache:top_p=0.99,streaming:fraction=0.25,streaming,streaming:fraction=0.25:window=16 \
    --out $d/heads-tune-essays
  $ac bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 --context 4096 \
    --new-tokens 32 --num-prompts 4 --needle-prompts 4 --profile $p \
    --policies dense,flexicache,flexicache:top_p=0.99,streaming,streaming:fraction=0.25:window=16 \
    --out $d/heads-ctx4096
  # the cost of a verify pass in dense steps at 8k (docs/decode.md, "Where the 8k verified ...");
  # verify-cost-ctx8192 was the masked verify attention, verify-cost-lse-ctx8192 the current one
  $py benchmarks/decode/verify_cost.py benchmarks/workloads/swe_agent.jsonl --context 8192 \
    --num-prompts 2 --profile $p --out $d/verify-cost-lse-ctx8192
  # on a quiet machine: dense decode against transformers (dense-quiet was the slot-major pool,
  # dense-headmajor the current one), then the 8k policies against the head-major dense decode
  $ac bench-dense-decode --threads 1 --contexts 1024,4096,8192 --new-tokens 32 --num-prompts 4 \
    --out $d/dense-headmajor
  $ac bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 --context 8192 \
    --new-tokens 32 --num-prompts 4 --needle-prompts 4 --profile $p \
    --policies dense,flexicache,flexicache:verify=8,flexicache:budget=128,flexicache:budget=256 \
    --out $d/headmajor-ctx8192
  $ac bench-decode benchmarks/workloads/swe_agent.jsonl --threads 1 --context 4096 \
    --new-tokens 32 --num-prompts 4 --needle-prompts 4 --profile $p \
    --policies dense,flexicache,flexicache:verify=8,flexicache:top_p=0.99,streaming,streaming:fraction=0.25:window=16 \
    --out $d/headmajor-ctx4096
  # short turns: the sparse decoder built for a turn its budget covers whole, against the dense
  # decode the engine gives such a turn (docs/decode.md "Budget")
  $py benchmarks/decode/short_turns.py --contexts 256 512 1000 --new-tokens 48 --repeats 5 \
    --threads 1 --profile $p --out $d/short-turns
}

# docs/benchmarks.md "Tiered KV store", docs/lab/tiers.md
tiers() {
  local t=docs/bench/tiers d=/tmp/agentcache-bench-tiers
  local b=(--batch 8 --max-sessions 8 --new-tokens 4 --ttft-samples 1)
  local six=(--policies slide,lru "${b[@]}" --max-turns 6 --kv-pages 320)
  local long=(--policies slide,lru "${b[@]}" --max-turns 16 --kv-pages 448)
  local swe=benchmarks/workloads/swe_agent.jsonl
  $ac bench-tiers $swe --policies slide,lru,lru-clean --batch 8 --max-sessions 8 --max-turns 3 \
    --new-tokens 4 --kv-pages 320 --ttft-samples 3 --disk-dir $d/0 --out $t
  $ac bench-tiers $swe --policies slide,lru "${b[@]}" --max-turns 2 --kv-pages 320 \
    --disk-dir $d/io --out $t/io
  $ac bench-tiers $swe "${six[@]}" --disk-dir $d/t6 --out $t/turns6
  $ac bench-tiers $swe "${six[@]}" --disk-dir $d/rc --out $t/reclaim
  for w in memgpt reflexion; do
    $ac bench-tiers benchmarks/workloads/$w.jsonl "${six[@]}" --disk-dir $d/$w --out $t/workloads/$w
  done
  for w in $W; do
    $ac bench-tiers benchmarks/workloads/$w.jsonl "${six[@]}" --no-adopt --disk-dir $d/na-$w \
      --out $t/no-adopt/$w
    $ac bench-tiers benchmarks/workloads/$w.jsonl "${six[@]}" --disk-dir $d/dl-$w --out $t/deltas/$w
  done
  $py benchmarks/tiers/adopt_fidelity.py benchmarks/workloads/{reflexion,memgpt,swe_agent}.jsonl \
    --sessions reflexion-01,reflexion-02,memgpt-01,memgpt-02,swe_agent-01,swe_agent-02 \
    --out docs/bench/adopt/a
  $py benchmarks/tiers/adopt_fidelity.py benchmarks/workloads/{reflexion,memgpt,swe_agent}.jsonl \
    --sessions reflexion-03,reflexion-04,memgpt-03,memgpt-04,swe_agent-03,swe_agent-04 \
    --out docs/bench/adopt/b
  $py benchmarks/tiers/adopt_fidelity.py --summary docs/bench/adopt/{a,b}/results.json --out docs/bench/adopt
  # sixteen-turn sessions (and 19 / 20 turns), with and without write-back
  $py benchmarks/workloads/build_workloads.py --turns 16 --out benchmarks/workloads/long
  $py benchmarks/workloads/build_workloads.py --turns 20 --only reflexion --out benchmarks/workloads/long20
  $py benchmarks/workloads/build_workloads.py --turns 19 --only memgpt --out benchmarks/workloads/long19
  for w in reflexion memgpt; do
    $ac bench-tiers benchmarks/workloads/long/$w.jsonl "${long[@]}" --disk-dir $d/l-$w \
      --out $t/long/$w
    $ac bench-tiers benchmarks/workloads/long/$w.jsonl "${long[@]}" --no-adopt \
      --disk-dir $d/lna-$w --out $t/long/$w-no-adopt
    $ac bench-tiers benchmarks/workloads/long/$w.jsonl "${long[@]}" --disk-dir $d/ld-$w \
      --out $t/deltas/long/$w
  done
  $ac bench-tiers benchmarks/workloads/long20/reflexion.jsonl --policies slide,lru "${b[@]}" \
    --max-turns 20 --kv-pages 464 --disk-dir $d/l20 --out $t/deltas/long20/reflexion
  $ac bench-tiers benchmarks/workloads/long19/memgpt.jsonl --policies slide,lru "${b[@]}" \
    --max-turns 19 --kv-pages 448 --disk-dir $d/l19 --out $t/deltas/long19/memgpt
  # disk I/O share, store replays, saved traces, a host tier, shift-only sessions
  $ac bench-tiers $swe "${six[@]}" --disk-dir $d/ios --out $t/deltas/io-share/swe_agent
  $ac bench-tiers $swe "${six[@]}" --disk-dir $d/rp --out $t/replay/swe_agent
  $ac bench-tiers $swe "${six[@]}" --store-replays 1 --save-traces --disk-dir $d/tr \
    --out $t/trace/swe_agent
  for w in swe_agent memgpt; do
    $ac bench-tiers benchmarks/workloads/$w.jsonl "${six[@]}" --save-traces --disk-dir $d/nc-$w \
      --out $t/nocopy/$w
  done
  $ac bench-tiers $swe "${six[@]}" --host-mib 472 --store-replays 1 --disk-dir $d/host \
    --out $t/host/swe_agent
  $ac bench-tiers $swe benchmarks/workloads/memgpt.jsonl --case shift --policies slide,lru \
    --batch 8 --max-turns 6 --new-tokens 4 --kv-pages 320 --ttft-samples 1 --disk-dir $d/sh \
    --out $t/shift
  $ac bench-tiers $swe benchmarks/workloads/memgpt.jsonl --case shift --policies slide,lru \
    --batch 8 --max-turns 3 --new-tokens 4 --kv-pages 320 --ttft-samples 8 --store-replays 0 \
    --disk-dir $d/sht --out $t/shift-ttft
  $py benchmarks/tiers/turns.py $t/results.json $t/{io,turns6,reclaim}/results.json \
    $t/{workloads,no-adopt,long,deltas,replay,trace,nocopy}/*/results.json \
    $t/deltas/{long,long19,long20}/*/results.json --out $t/long
  $py benchmarks/tiers/throughput.py $(find $t -name results.json | sort) --out $t/throughput
}

# docs/lab/cope.md
cope() {
  local c=docs/bench/cope
  $ac train-cope --threads 1 --out $c/train.json
  HF_HUB_OFFLINE=1 PYTHONPATH=. $py benchmarks/cope/drift.py --threads 1 --out $c/drift
  for w in reflexion memgpt; do
    local s=$w-02 sfx=""
    [ $w = memgpt ] && sfx=-memgpt
    $ac bench benchmarks/workloads/$w.jsonl --sessions $s --max-turns 3 --new-tokens 16 \
      --strategies full,pic,cacheslide,cacheslide:plan=mode --threads 1 --out $c/e2e-rope$sfx
    $ac bench benchmarks/workloads/$w.jsonl --cope --sessions $s --max-turns 3 --new-tokens 16 \
      --strategies full,pic,cacheslide,cacheslide:plan=ccpe --threads 1 --out $c/e2e-cope$sfx
  done
}

areas=("$@")
[ ${#areas[@]} -eq 0 ] || [ "${areas[0]}" = all ] && areas=(reuse server vllm decode tiers cope)
for area in "${areas[@]}"; do
  case $area in
    reuse | server | vllm | decode | tiers | cope) "$area" ;;
    *) echo "run_docs_bench.sh: unknown area '$area' (reuse server vllm decode tiers cope all)" >&2
       exit 2 ;;
  esac
done
