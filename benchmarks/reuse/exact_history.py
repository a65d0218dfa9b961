#!/usr/bin/env python3
"""Whether the default's turns part from full recompute's because of what earlier turns stored.

Each session runs on two engines, turn by turn. `own` commits every turn as the bench does under
the default (its store holds K/V the default reused approximately, and K/V computed after it);
`exact` commits every turn with every moved token computed (`epic` with a boundary longer than
any segment), so its store holds full recompute's K/V of each segment after the context it was
stored in. On each warm turn both engines run the default once more without committing, and its
32-token greedy continuation is compared with `full`'s on the same engine; the workload's
replies are committed as the bench commits them. A turn that parts from full's on both engines
parts because of its own approximation, not because of what earlier turns stored.

    python benchmarks/reuse/exact_history.py benchmarks/workloads/chat-sysprompt.jsonl \
        --sessions chat-sysprompt-00,chat-sysprompt-02 \
        --out docs/bench/edits/starts/exact-history-tune

Writes results.json (with provenance) and report.md under --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.provenance import provenance, provenance_line
from agentcache.bench.results import write_run
from agentcache.bench.reuse.harness import reply_tokens
from agentcache.model.loading import load_model
from agentcache.reuse.spec import StrategySpec
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.workload.files import load_workload

STORES = {"own": "rpdc", "exact": "epic"}  # how each engine commits a turn
EVERY_TOKEN = {"epic": {"boundary_k": 10**6}}  # every moved token computed: full's K/V stored


def run_session(engines: dict[str, Engine], session: Any, new_tokens: int) -> list[dict[str, Any]]:
    params = GenerationParams(max_new_tokens=new_tokens)
    rows = []
    for ti, turn in enumerate(session.turns):
        prompt = next(iter(engines.values())).tokenize(turn.prompt)  # one model: one tokenizer
        row: dict[str, Any] = {"session": session.name, "case": session.case, "turn": ti,
                               "prompt_tokens": prompt.num_tokens}  # fmt: skip
        for store, engine in engines.items():
            if ti > 0:
                ref = engine.generate(prompt, params, strategy="full", commit=False)
                got = engine.generate(prompt, params, strategy="rpdc", commit=False)
                row[f"{store}_greedy_equal"] = got.token_ids == ref.token_ids
                row[f"{store}_first_equal"] = got.token_ids[:1] == ref.token_ids[:1]
                row[f"{store}_recomputed"] = got.stats.recomputed_tokens
            seq, pre = engine.prefill(prompt, strategy=STORES[store])
            engine.commit(prompt, seq, pre, strategy=STORES[store])
            if turn.reply is not None:
                ids = reply_tokens(engine.model, prompt, turn.reply)
                engine.commit_reply(prompt, seq, pre, ids, turn.reply, strategy=STORES[store])
            seq.free()
        rows.append(row)
        print(row, flush=True)
    return rows


def render(results: dict[str, Any]) -> str:
    warm = [r for r in results["turns"] if r["turn"] > 0]
    lines = ["# The default on a store of its own and on a store of full recompute's K/V", "",
             provenance_line(results["provenance"]), "",
             "Greedy continuation equal to `full`'s on the same engine (yes/no), tokens the "
             "default computed:", "",
             "| session | turn | own store | exact store |", "|---|---|---|---|"]  # fmt: skip
    for r in warm:
        own = f"{'yes' if r['own_greedy_equal'] else 'no'} ({r['own_recomputed']})"
        exact = f"{'yes' if r['exact_greedy_equal'] else 'no'} ({r['exact_recomputed']})"
        lines.append(f"| {r['session']} | {r['turn']} | {own} | {exact} |")
    both = sum(r["own_greedy_equal"] == r["exact_greedy_equal"] for r in warm)
    lines += ["", f"The two stores give the same outcome on {both} of {len(warm)} warm turns."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", type=Path)
    ap.add_argument("--sessions", required=True, help="comma-separated session names")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = args.sessions.split(",")
    sessions = {s.name: s for s in load_workload(args.workload).sessions}
    unknown = [n for n in names if n not in sessions]
    if unknown:
        ap.error(f"no such sessions in {args.workload}: {', '.join(unknown)}")
    model = load_model(None)
    rows: list[dict[str, Any]] = []
    for name in names:
        engines = {
            "own": Engine(model),
            "exact": Engine(model, EngineConfig(strategy_options=EVERY_TOKEN)),
        }
        rows += run_session(engines, sessions[name], args.new_tokens)
    specs = [StrategySpec.parse("rpdc"), StrategySpec.parse("full")]
    splits = {sessions[n].split for n in names}
    origin = provenance(specs, splits.pop() if len(splits) == 1 else None, names,
                        script="benchmarks/reuse/exact_history.py")  # fmt: skip
    write_run(args.out, {"provenance": origin, "turns": rows}, render)
    print(f"wrote {args.out}/results.json and report.md")


if __name__ == "__main__":
    main()
