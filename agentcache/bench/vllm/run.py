"""`agentcache bench --backend vllm`: vLLM + agentcache vs vLLM's prefix caching alone.

Each configuration runs in a process of its own (a fresh vLLM engine, an empty prefix cache,
for agentcache an empty segment folder) over the same turns:

    none              vLLM without any reuse: the fidelity reference
    prefix            vLLM's automatic prefix caching alone (the baseline)
    agentcache:NAME   vLLM's prefix caching + agentcache's connector, reuse strategy NAME
                      (NAME@vllm, NAME@engine: with that `fill`, see docs/vllm.md)

With `--rounds R` the list runs R times, round r in an order rotated by r, so that over
len(configs) rounds each configuration takes each slot once:

    round 0   none    prefix  agentcache:A  agentcache:B
    round 1   prefix  agentcache:A  agentcache:B  none
    round 2   agentcache:A  agentcache:B  none  prefix      ...

each configuration-round still a process of its own; the report pairs turns of the same round.
Each finished configuration-round's result is kept in `OUT/configs/`; `--resume` takes the
kept results measured on the same turns instead of running them again (a run cut short loses
only the configuration-round it was in).

Per turn: TTFT = time from submitting a one-token request to its first token (what
`VLLMBackend.generate` measures around vLLM's engine steps), the first token and the top-5
candidates; `agentcache.bench.vllm.report` summarizes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcache.bench.provenance import provenance
from agentcache.bench.results import write_run
from agentcache.bench.vllm.report import merge_rounds, plot, report_markdown, summarize
from agentcache.engines.vllm import IN_PROCESS_ENV
from agentcache.reuse.spec import StrategySpec
from agentcache.workload.files import Session, parse_session

TURN_PREFIX = "TURN "


def bench_configs(strategies: list[str]) -> list[str]:
    """The configurations a run measures, in order: `none` and `prefix` (the `reuse` baselines
    of `VLLMConfig`), then `agentcache:<strategy>` for each strategy."""
    return ["none", "prefix"] + [f"agentcache:{s}" for s in strategies]


def round_orders(configs: list[str], rounds: int) -> list[list[str]]:
    """The order of each round: round r runs `configs` rotated left by r (mod their number)."""
    return [configs[r % len(configs) :] + configs[: r % len(configs)] for r in range(rounds)]


def run_config(config: str, sessions_file: Path, out_file: Path, store_dir: str) -> None:
    """One configuration over every session (runs in its own process)."""
    from agentcache.engines.vllm.backend import VLLMBackend, VLLMConfig
    from agentcache.runtime.engine import GenerationParams

    reuse, _, strategy = config.partition(":")
    strategy, _, fill = strategy.partition("@")
    sessions = [
        parse_session(json.loads(line), f"s{i}", "")
        for i, line in enumerate(sessions_file.read_text().splitlines())
    ]
    options: dict[str, Any] = {"reuse": reuse, "store_dir": store_dir, "logprobs": 5}
    if strategy:
        options |= {"strategy": strategy, "fill": fill or "auto"}
    t0 = time.perf_counter()
    backend = VLLMBackend(VLLMConfig(**options))
    startup = time.perf_counter() - t0
    records = []
    for session in sessions:
        for ti, turn in enumerate(session.turns):
            g = backend.generate(turn.prompt, GenerationParams(max_new_tokens=1))
            logits = g.first_token_logits
            info = backend.last_transfer
            records.append({
                "config": config, "session": session.name, "workload": session.workload,
                "case": session.case, "turn": ti, "prompt_tokens": g.stats.prompt_tokens,
                "ttft_ms": g.stats.ttft_s * 1e3,
                "first_token": int(logits.argmax()),
                "top5": logits.topk(5).indices.tolist(),
                "vllm_cached_tokens": int(info.get("vllm_cached_tokens", 0)),
                "claimed_tokens": int(info.get("claimed_tokens", 0)),
                "engine_reused_tokens": int(info.get("reused_tokens", 0)),
                "engine_computed_tokens": int(info.get("computed_tokens", 0)),
                "vllm_computed_tokens": g.stats.recomputed_tokens - int(
                    info.get("computed_tokens", 0)),
                "stages": int(info.get("stages", 1)),
                "fill": str(info.get("fill", "")),
                "fill_ms": float(info.get("fill_ms", 0.0)),
                "fallbacks": int(info.get("fallbacks", 0)),
            })  # fmt: skip
            print(f"{TURN_PREFIX}{config} {session.name} {ti}", flush=True)
    # what fill="auto" measured: ms of TTFT per computed token, staged (vllm) and engine
    costs = dict(backend.chooser().cost_ms)
    out_file.write_text(json.dumps({"startup_s": startup, "records": records, "fill_costs": costs}))


def run_all(
    sessions: list[Session],
    strategies: list[str],
    out: Path,
    advance: Callable[[str], None],
    threads: int | None = None,
    resume: bool = False,
    rounds: int = 1,
) -> dict[str, Any]:
    """Every configuration-round in its own process (`rounds` rounds, see the module
    docstring); returns the merged results (also written). `threads` sets the engine
    processes' OpenMP threads (`OMP_NUM_THREADS`, which vLLM respects); None leaves vLLM's
    default. Each finished configuration-round's result is kept in `out/configs/`; with
    `resume`, one kept there for the very same turns is not run again."""
    env = dict(os.environ) | {IN_PROCESS_ENV: "0"}  # each engine core in its run's process
    env |= {"OMP_NUM_THREADS": str(threads)} if threads else {}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentcache-vllm-bench-") as tmp:
        # each configuration's segment store holds GBs of KV: it goes when its run is done
        runs = _run_configs(
            Path(tmp), sessions, strategies, advance, env, out / "configs", resume, rounds
        )
    results = summarize(merge_rounds(runs), schedule(runs))
    results["provenance"] = prov = run_provenance(sessions, strategies)
    results["command"] = prov["command"]  # `agentcache bench ...`, however the CLI was started
    write_run(out, results, report_markdown)
    plot(results, out / "ttft.png")
    return results


def run_provenance(sessions: list[Session], strategies: list[str]) -> dict[str, Any]:
    """The run's provenance, its specs keyed by configuration (`agentcache:NAME[@FILL]`, the
    label the records carry; the fill does not change what the strategy computes)."""
    specs = [
        replace(StrategySpec.parse(s.partition("@")[0]), label=f"agentcache:{s}")
        for s in strategies
    ]
    splits = sorted({s.split for s in sessions})
    split = splits[0] if len(splits) == 1 else "mixed"
    return provenance(specs, split, [s.name for s in sessions])


def schedule(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """When and where each configuration-round ran: round, slot in its round, start (Unix
    seconds) and duration, and whether this invocation took it from the kept results."""
    keys = ("config", "round", "slot", "started_unix", "seconds", "kept")
    return [{k: run.get(k) for k in keys} for run in runs]


def _run_configs(
    work: Path,
    sessions: list[Session],
    strategies: list[str],
    advance: Callable[[str], None],
    env: dict[str, str],
    kept: Path | None = None,
    resume: bool = False,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Run each configuration-round in `round_orders`' order (or, with `resume`, take it from
    `kept` when it was measured on the same turns); each finished result is copied into
    `kept`. Returns the runs in that order, each with its `config`, `round`, `slot` and
    `kept`, its records carrying their `round`."""
    sessions_text = "\n".join(json.dumps(_session_json(s)) for s in sessions)
    turns_id = hashlib.blake2b(sessions_text.encode(), digest_size=8).hexdigest()
    sessions_file = work / "sessions.jsonl"
    sessions_file.write_text(sessions_text)
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
    runs = []
    for rnd, order in enumerate(round_orders(bench_configs(strategies), rounds)):
        for slot, config in enumerate(order):
            name = _run_name(config, rnd)
            if resume and kept is not None and (run := _kept_run(kept / name, turns_id)):
                for r in run["records"]:
                    advance(f"round {rnd} {config} {r['session']} {r['turn']} (kept)")
                runs.append(run | {"kept": True})
                continue
            started = time.time()
            run = _run_process(config, rnd, work, sessions_file, advance, env)
            run |= {"config": config, "round": rnd, "slot": slot, "turns_id": turns_id,
                    "started_unix": started, "seconds": time.time() - started}  # fmt: skip
            if kept is not None:
                (kept / name).write_text(json.dumps(run))
            runs.append(run | {"kept": False})
    return runs


def _run_name(config: str, rnd: int) -> str:
    """The file name of a configuration-round's result: readable, and unique per config."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in config)
    return f"{name}-{hashlib.blake2b(config.encode(), digest_size=4).hexdigest()}-round{rnd}.json"


def _run_process(
    config: str,
    rnd: int,
    work: Path,
    sessions_file: Path,
    advance: Callable[[str], None],
    env: dict[str, str],
) -> dict[str, Any]:
    """One configuration-round in a process of its own (`run_config`); its result, the
    records tagged with the round. Its segment store is removed when the process ends."""
    name = _run_name(config, rnd).removesuffix(".json")
    result, store = work / f"{name}.json", work / f"store-{name}"
    args = [sys.executable, "-m", "agentcache.bench.vllm.run", config,
            str(sessions_file), str(result), str(store)]  # fmt: skip
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(TURN_PREFIX):
                advance(f"round {rnd} " + line.removeprefix(TURN_PREFIX).strip())
    shutil.rmtree(store, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"vLLM bench configuration {config} (round {rnd}) failed (exit {proc.returncode})"
        )
    run: dict[str, Any] = json.loads(result.read_text())
    run["records"] = [r | {"round": rnd} for r in run["records"]]
    return run


def _kept_run(path: Path, turns_id: str) -> dict[str, Any] | None:
    """A kept configuration-round result, if it is whole and measured on the same turns."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or cut short: measured again
    whole = isinstance(run, dict) and {"records", "config", "round", "slot"} <= run.keys()
    if not whole or run["turns_id"] != turns_id:
        return None
    return run


def _session_json(s: Session) -> dict[str, Any]:
    turns = []
    for t in s.turns:
        segs = [{"kind": g.kind.value, "text": g.text, "id": g.id, "role": g.role}
                for g in t.prompt.segments]  # fmt: skip
        turns.append({"segments": segs, "max_new_tokens": t.max_new_tokens})
    return {"name": s.name, "workload": s.workload, "case": s.case, "turns": turns}


if __name__ == "__main__":
    run_config(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
