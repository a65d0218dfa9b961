"""How `cover_min` changes the default's plans: `rpdc` with and without a floor, replayed on the
tuning (or, with `--split validate`, validation) sessions of workload files, turn by turn.

A plan is decided before any layer runs, from the prompt's tokens and what the store holds
(which segments are found, and whether their KV is exact here): not from the model's weights.
So the sessions run on a random model of 4 layers and width 64 carrying the default model's
tokenizer and chat format, which plans what the default model plans at a sliver of its cost;
its outputs are not measured. Each strategy runs the session in its own engine, as a server
would (a turn made exact stores exact KV, which later turns then find), with replies stored as
the bench stores them (the workload's reply in place of a generated one). The cost guard is
off: its weights would be the random model's shapes, not the default model's.

With `--probe-runs` (stored bench runs of `full`, `prefix` and rpdc without cover on tuning
sessions, docs/bench/tune-cover/*), it also reads what the probe costs besides computing
tokens: per ranked turn, rpdc's time outside the model's layers less prefix's on the same turn,
in tokens of full's TTFT per prompt token on that turn (the check on `cover_min`'s derivation,
which predicts probe_layers / num_layers * probe_window = 10/30 * 128 = 43 on the default model).

Per turn: the candidates (reused tokens whose context changed, not computed anyway), the
tokens computed anyway, whether the plan was exact (every candidate computed, no probe) and
the tokens computed (`recomputed_tokens`), for each strategy.

    nice -n 19 python benchmarks/reuse/cover_min_plans.py benchmarks/workloads/{memgpt,\
reflexion,swe_agent,chat-edit,chat-sysprompt,chat-compact,chat-retry,chat-fork}.jsonl \
        --out docs/bench/cover-min --probe-runs docs/bench/tune-cover/{memgpt,reflexion,swe_agent}
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.reuse.harness import reply_tokens
from agentcache.model.loading import LoadedModel, from_hf, load_tokenizer, model_folder
from agentcache.model.tokenizer import HFTokenizer
from agentcache.runtime import Engine, EngineConfig
from agentcache.workload.files import Session, load_workload

# `rpdc:cover=1.5` is the default without its floor (`cover_min=256` joined it later)
SPECS = {"floor": "rpdc:cover_min=106", "no_floor": "rpdc:cover=1.5"}


def planning_model() -> LoadedModel:
    """A seeded random 4-layer llama with the default model's vocabulary and tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = model_folder(None)
    tokenizer = HFTokenizer(load_tokenizer(folder), folder.name)
    vocab_size = max(tokenizer.vocab.values()) + 1
    config = AutoConfig.for_model(
        "llama", vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return from_hf(AutoModelForCausalLM.from_config(config).eval(), tokenizer, "planning")


def engine_for(model: LoadedModel, spec: str) -> Engine:
    name, *pairs = spec.split(":")
    options = {k: json.loads(v) for k, v in (p.split("=") for p in pairs)}
    config = EngineConfig(strategy=name, strategy_options={name: options}, cost_guard=False)
    return Engine(model, config)


def run_session(
    model: LoadedModel, session: Session, specs: dict[str, str]
) -> list[dict[str, Any]]:
    engines = {label: engine_for(model, spec) for label, spec in specs.items()}
    rows = []
    for ti, turn in enumerate(session.turns):
        row: dict[str, Any] = {"session": session.name, "turn": ti}
        for label, engine in engines.items():
            prompt = engine.tokenize(turn.prompt)
            seq, pre = engine.prefill(prompt)
            engine.commit(prompt, seq, pre)
            if turn.reply is not None:
                ids = reply_tokens(model, prompt, turn.reply)
                engine.commit_reply(prompt, seq, pre, ids, turn.reply)
            seq.free()
            s = pre.stats
            exact = s.candidates == 0 or s.probe_skipped  # nothing to rank, or all computed
            row |= {"prompt_tokens": prompt.num_tokens, f"{label}_candidates": s.candidates,
                    f"{label}_anyway": s.computed_anyway, f"{label}_exact": exact,
                    f"{label}_computed": s.recomputed_tokens,
                    f"{label}_epic_turn": s.epic_turn}  # fmt: skip
        rows.append(row)
    return rows


def summary(family: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    warm = [r for r in rows if r["turn"] > 0]
    changed = [r for r in warm if r["floor_computed"] != r["no_floor_computed"]]
    return {
        "family": family,
        "warm_turns": len(warm),
        "exact_no_floor": sum(r["no_floor_exact"] for r in warm),
        "exact_floor": sum(r["floor_exact"] for r in warm),
        "chunk_start_turns": sum(bool(r.get("floor_epic_turn")) for r in warm),
        "changed": len(changed),
        "added_tokens": [r["floor_computed"] - r["no_floor_computed"] for r in changed],
        "min_candidates_ranked": min(
            (r["no_floor_candidates"] for r in warm if not r["no_floor_exact"]), default=None
        ),
    }


def probe_overhead(folder: Path) -> list[float]:
    """Per ranked warm turn of a stored tuning run: (rpdc's overhead - prefix's) in tokens."""
    rows: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for t in json.loads((folder / "results.json").read_text())["turns"]:
        rows.setdefault((t["session"], t["turn"]), {})[t["strategy"]] = t
    out = []
    for (_, turn), r in sorted(rows.items()):
        a, prefix, full = r["rpdc"], r["prefix"], r["full"]
        if turn > 0 and a["candidates"] > 0 and not a["probe_skipped"]:
            ms_per_token = full["ttft_ms"] / full["prompt_tokens"]
            out.append((a["overhead_ms"] - prefix["overhead_ms"]) / ms_per_token)
    return out


def overhead_lines(folders: list[Path]) -> list[str]:
    lines = ["", "The probe's cost besides computing tokens, in tokens of full's TTFT "
             "(rpdc without cover less prefix, ranked warm turns of the stored tuning runs):",
             "", "| run | turns | median | q25 | q75 |", "|---|---|---|---|---|"]  # fmt: skip
    every: list[float] = []
    for folder in folders:
        v = probe_overhead(folder)
        every += v
        q = statistics.quantiles(v, n=4)
        lines.append(f"| {folder} | {len(v)} | {statistics.median(v):.1f} | {q[0]:.1f} "
                     f"| {q[2]:.1f} |")  # fmt: skip
    q = statistics.quantiles(every, n=4)
    lines.append(f"| all | {len(every)} | {statistics.median(every):.1f} | {q[0]:.1f} "
                 f"| {q[2]:.1f} |")  # fmt: skip
    return lines


def table(summaries: list[dict[str, Any]]) -> str:
    lines = [
        "| family | warm turns | exact without floor | exact with floor | turns changed "
        "| tokens computed added per changed turn | fewest candidates of a ranked turn "
        "(no floor) | chunk-start turns (`epic_over`) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        added = ", ".join(map(str, s["added_tokens"])) or "-"
        fewest = "-" if s["min_candidates_ranked"] is None else str(s["min_candidates_ranked"])
        lines.append(
            f"| {s['family']} | {s['warm_turns']} | {s['exact_no_floor']} | {s['exact_floor']} "
            f"| {s['changed']} | {added} | {fewest} | {s.get('chunk_start_turns', 0)} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="folder for plans.md, plans.json")
    p.add_argument("--split", choices=("tune", "validate"), default="tune",
                   help="which half of each workload to replay (default: tune)")  # fmt: skip
    p.add_argument("--floor", default=SPECS["floor"],
                   help=f"the spec with a floor (default: {SPECS['floor']})")  # fmt: skip
    p.add_argument("--against", default=SPECS["no_floor"],
                   help=f"the spec it is compared with (default: {SPECS['no_floor']}, the "
                   "default before its floor)")  # fmt: skip
    p.add_argument("--probe-runs", type=Path, nargs="*", default=[],
                   help="stored tuning runs of full, prefix and rpdc without cover")  # fmt: skip
    args = p.parse_args()
    torch.set_num_threads(1)
    specs = {"floor": args.floor, "no_floor": args.against}
    model = planning_model()
    summaries, every = [], []
    for path in args.workloads:
        sessions = [s for s in load_workload(path).sessions if s.split == args.split]
        rows = [r for s in sessions for r in run_session(model, s, specs)]
        every += rows
        summaries.append(summary(path.stem, rows))
        print(table(summaries[-1:]).splitlines()[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    named = ", ".join(f"{k} = `{v}`" for k, v in specs.items())
    half = {"tune": "tuning", "validate": "validation"}[args.split]
    title = ("`cover_min`: plans with and without the floor" if args.against == SPECS["no_floor"]
             else f"`{args.floor}` against `{args.against}`: plans")  # fmt: skip
    text = f"# {title}, {half} sessions\n\n{named}\n\n"
    extra = overhead_lines(args.probe_runs) if args.probe_runs else []
    (args.out / "plans.md").write_text(text + "\n".join([table(summaries), *extra]) + "\n")
    (args.out / "plans.json").write_text(json.dumps({"summaries": summaries, "turns": every}))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
