#!/usr/bin/env python3
"""Concurrent agents replaying workload chat sessions, with tool pauses, against servers over
HTTP: `agentcache serve` (embedded, default strategy and `--strategy prefix`; `--backend vllm`)
and plain `vllm serve --enable-prefix-caching` on the same model and sessions.

    HF_HUB_OFFLINE=1 python benchmarks/server/replay.py --split all --clients 1,4,16 \
        --targets embedded,embedded-prefix,vllm-backend,vllm \
        --vllm-python .venv-vllm/bin/python --rounds 2 --out docs/bench/server/replay

Sessions: the chat sessions of `--workload` (default benchmarks/workloads/chat.jsonl:
dialogues, and tool-use sessions whose tool results bfcl's simulators produced), chosen by
`--split`, `--sessions NAME,...` and `--n`. Each turn sends the workload's message list as the
client sends it, whatever the server replied, so every target gets the same requests. After
each turn but the last the agent pauses (its tools running) for a log-normal draw
(`--pause-median`, `--pause-sigma`, capped at `--pause-max`, seeded by `--seed` and the
session's name: the same for every target and N, recorded in results.json). With
`--tenants K` the sessions replay as K tenants in turn, session i sending `cache_salt`
`tenant-<i mod K>` (agentcache and vLLM both keep a salt's cache to itself).

A target may run as variants with more server arguments, each under its own label, e.g.
`--targets embedded@drop,embedded@tiers --target-args 'embedded@drop=--retention-share 0'
--target-args 'embedded@tiers=--store-host-bytes 1GiB'` (agentcache-served targets only; plain
vLLM takes `--vllm-serve-args`).

Phases, each against a fresh server process: per target a solo phase (each session alone, one
after another, no pauses: the reference replies), then per N in `--clients` a load phase (N
agents at once take the sessions from one queue). With `--rounds R` the load phases repeat R
times, the target order rotated each round, so ratios between targets are taken within a round.
Reported per target and N (medians over rounds): aggregate prompt and decode tokens/s, p50/p99
TTFT of first and resumed turns (client-measured; server-reported where given), job completion
time per session, cached-token share, preemptions, bytes swapped and spilled, and the tiered
store's pages prefetched and promoted from /metrics (None where a server has no such
counter), and the greedy replies that differ
from the session's solo replies on the same target. Writes results.json (with provenance),
report.md, replay.png and servers.log into `--out`.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WARMUP = {"messages": [{"role": "system", "content": "You answer in one short sentence."},
                       {"role": "user", "content": "Name a colour."}]}  # fmt: skip


def schedule(targets: list[str], levels: list[int], rounds: int) -> list[tuple[int, str, int]]:
    """The phases in run order as (round, target, N), N = 0 for a target's solo phase: every
    target's solo phase in round 0 before its load phases; the targets rotated by one each
    round, N ascending within a target."""
    out = []
    for r in range(rounds):
        k = r % len(targets)
        for target in targets[k:] + targets[:k]:
            out += [(r, target, 0)] if r == 0 else []
            out += [(r, target, n) for n in levels]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from agentcache.bench.server.targets import DEFAULT_VLLM_EXTRA, TARGETS, parse_targets

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workload", type=Path, default=ROOT / "benchmarks/workloads/chat.jsonl")
    p.add_argument("--split", default="validate", choices=("tune", "validate", "all"))
    p.add_argument("--sessions", default="", help="session names, comma-separated (default: all)")
    p.add_argument("--n", type=int, default=None, help="the first N sessions only")
    p.add_argument("--clients", default="1,4,16", help="concurrency levels, comma-separated")
    p.add_argument(
        "--targets",
        default="embedded,embedded-prefix",
        help=f"comma-separated, the first the ratios' reference: {', '.join(TARGETS)}; each "
        "also as TARGET@NAME, a variant with --target-args",
    )
    p.add_argument(
        "--target-args",
        action="append",
        default=[],
        metavar="LABEL=ARGS",
        help="more server arguments for a target of --targets (repeatable), e.g. "
        "'embedded@tiers=--store-host-bytes 1GiB' or 'vllm-backend=--max-active 16' (not plain "
        "vllm: --vllm-serve-args)",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--model", default="default", help="tiny, default or a model folder")
    p.add_argument("--vllm-python", default=None, help="the vLLM venv's Python (vLLM targets)")
    p.add_argument(
        "--vllm-serve-args",
        default=DEFAULT_VLLM_EXTRA,
        help="more `vllm serve` arguments (default: %(default)s)",
    )
    p.add_argument(
        "--vllm-chat-template",
        default="agentcache",
        help="the chat template plain vLLM renders requests with: 'agentcache' (default: the "
        "messages and tools as agentcache's server renders them, so every target gets the same "
        "prompts), 'model' (the model's own) or a file",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per agentcache server")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="every turn's reply budget (default: the workload's per turn)",
    )
    p.add_argument("--pause-median", type=float, default=2.0, help="seconds")
    p.add_argument("--pause-sigma", type=float, default=1.0, help="of the pause's logarithm")
    p.add_argument("--pause-max", type=float, default=60.0, help="seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tenants",
        type=int,
        default=1,
        help="tenants the sessions replay as, in turn: session i sends cache_salt "
        "'tenant-<i mod K>' to every target (default 1: no cache_salt)",
    )
    args = p.parse_args(argv)
    args.levels = sorted({int(x) for x in args.clients.split(",") if x.strip()})
    args.target_list = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not args.levels or min(args.levels) < 1:
        p.error("--clients needs concurrency levels >= 1")
    if not args.target_list:
        p.error(f"--targets must name some of {', '.join(TARGETS)}")
    try:
        args.target_specs = parse_targets(args.target_list, args.target_args)
    except ValueError as e:
        p.error(str(e))
    if args.rounds < 1 or args.threads < 1 or args.tenants < 1:
        p.error("--rounds, --threads and --tenants must be >= 1")
    template = args.vllm_chat_template
    if template not in ("agentcache", "model") and not Path(template).is_file():
        p.error(f"--vllm-chat-template {template!r}: not 'agentcache', 'model' or a file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from agentcache.bench.server.agents import load_sessions
    from agentcache.bench.server.pauses import PauseModel

    names = [x.strip() for x in args.sessions.split(",") if x.strip()]
    sessions = load_sessions(args.workload, args.split, names, args.n)
    if args.tenants > 1:
        sessions = [replace(s, salt=f"tenant-{i % args.tenants}") for i, s in enumerate(sessions)]
    if max(args.levels) > len(sessions):
        sys.exit(f"error: N = {max(args.levels)} needs at least as many sessions; "
                 f"{len(sessions)} selected (try --split all)")  # fmt: skip
    model = PauseModel(args.pause_median, args.pause_sigma, args.pause_max)
    pauses = {s.name: model.session_pauses(args.seed, s.name, len(s.requests)) for s in sessions}
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args, sessions, pauses, argv if argv is not None else sys.argv[1:])
    from agentcache.bench.results import write_run
    from agentcache.bench.server.replay_report import plot, render

    plot(results, args.out / "replay.png")
    print(write_run(args.out, results, render))
    return 0


def target_options(args: argparse.Namespace) -> Any:
    from agentcache.bench.server.targets import TargetOptions
    from agentcache.chat.tools import chat_template

    folder = None
    if any(t.base == "vllm" for t in args.target_specs):
        if args.model == "default":
            from agentcache.model.loading import convert_default_model, default_cache_dir

            folder = str(convert_default_model(default_cache_dir()))
        elif args.model != "tiny":
            folder = args.model
    template = {"agentcache": str(chat_template()), "model": None}.get(
        args.vllm_chat_template, args.vllm_chat_template
    )
    return TargetOptions(
        args.model, args.vllm_python, args.vllm_serve_args, args.threads, folder, template
    )


def run(args: argparse.Namespace, sessions: list[Any], pauses: dict[str, list[float]],
        argv: list[str]) -> dict[str, Any]:  # fmt: skip
    from tqdm import tqdm

    from agentcache.bench.provenance import load_average, provenance, specs_of
    from agentcache.bench.server.replay_summary import level_table, ratios
    from agentcache.reuse import DEFAULT_STRATEGY

    options = target_options(args)
    phases = schedule(args.target_list, args.levels, args.rounds)
    per_phase = sum(len(s.requests) for s in sessions)
    log = args.out / "servers.log"
    log.write_text("")
    load_before, t_start = load_average(), time.perf_counter()
    solo: dict[str, dict[tuple[str, int], str]] = {}
    solo_records: dict[str, list[dict[str, Any]]] = {}
    runs: list[dict[str, Any]] = []
    with tqdm(total=per_phase * len(phases), unit="req", desc="replay") as bar:
        for rnd, target, n in phases:
            bar.set_postfix_str(f"round {rnd} {target} {'solo' if n == 0 else f'N={n}'}")
            record = one_phase(args, options, log, target, n, sessions, pauses,
                               solo.get(target, {}), lambda _: bar.update())  # fmt: skip
            if n == 0:
                solo[target], solo_records[target] = record["replies"], record["turns"]
            else:
                runs.append({"round": rnd, **record})
    bases = {t.base for t in args.target_specs}
    labels = [DEFAULT_STRATEGY] * ("embedded" in bases) + ["prefix"] * ("embedded-prefix" in bases)
    origin = provenance(specs_of(labels), args.split, [s.name for s in sessions], argv,
                        script="benchmarks/server/replay.py")  # fmt: skip
    return {
        "provenance": origin,
        "config": config(args, options, pauses),
        "sessions": [{"name": s.name, "case": s.case, "turns": len(s.requests),
                      "salt": s.salt} for s in sessions],
        "turns_per_phase": per_phase,
        "pauses": pauses,
        "load_average": {"before": load_before, "after": load_average()},
        "wall_s": time.perf_counter() - t_start,
        "levels": level_table(runs),
        "ratios": ratios(runs, args.target_list[0]),
        "solo": solo_records,
        "runs": runs,
    }  # fmt: skip


def one_phase(
    args: argparse.Namespace, options: Any, log: Path, target: str, n: int, sessions: list[Any],
    pauses: dict[str, list[float]], solo: dict[tuple[str, int], str], tick: Any,
) -> dict[str, Any]:  # fmt: skip
    """A phase against a fresh `target` process: solo (n = 0: one agent, no pauses) or N
    agents with their pauses. A solo phase returns its replies; a load phase its summary."""
    import httpx

    from agentcache.bench.server import counters
    from agentcache.bench.server.agents import run_phase
    from agentcache.bench.server.chat_client import stream_turn
    from agentcache.bench.server.replay_summary import solo_replies, summarize_phase
    from agentcache.bench.server.targets import SERVED_NAME, ServerProcess

    (spec,) = [t for t in args.target_specs if t.label == target]
    with ServerProcess(spec, options, log) as server:
        with httpx.Client(base_url=server.url, timeout=1800) as http:  # one-time costs first
            stream_turn(http, SERVED_NAME, WARMUP, 4)
        before = counters.scrape(server.url)
        phase = run_phase(server.url, SERVED_NAME, sessions, max(n, 1),
                          {} if n == 0 else pauses, args.max_tokens, tick)  # fmt: skip
        change = counters.difference(before, counters.scrape(server.url))
        argv = server.argv
    turns = [r.to_dict() for r in phase.turns]
    if n == 0:
        return {"replies": solo_replies(phase), "turns": turns}
    return {"target": target, "clients": n, "argv": argv,
            "summary": summarize_phase(phase, solo, change), "turns": turns}  # fmt: skip


def config(
    args: argparse.Namespace, options: Any, pauses: dict[str, list[float]]
) -> dict[str, Any]:
    drawn = [x for xs in pauses.values() for x in xs]
    return {
        "model": args.model, "workload": str(args.workload.relative_to(ROOT))
        if args.workload.is_relative_to(ROOT) else str(args.workload),
        "split": args.split, "targets": args.target_list, "clients": args.levels,
        "target_args": {t.label: list(t.args) for t in args.target_specs if t.args},
        "rounds": args.rounds, "threads": args.threads, "max_tokens": args.max_tokens,
        "tenants": args.tenants,
        "vllm_python": args.vllm_python, "vllm_serve_args": args.vllm_serve_args,
        "vllm_chat_template": args.vllm_chat_template,
        "model_folder": options.model_folder,
        "pauses": {"median_s": args.pause_median, "sigma": args.pause_sigma,
                   "max_s": args.pause_max, "seed": args.seed, "total_s": sum(drawn),
                   "longest_s": max(drawn, default=0.0)},
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
