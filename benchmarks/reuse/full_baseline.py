"""Is `full` a fair baseline? agentcache's full prefill against `transformers`' forward pass.

Every TTFT ratio in `agentcache bench` is against `full`, agentcache's own engine recomputing
the whole prompt. A slow `full` would flatter every strategy. This script times, on the same
prompts and weights, the engine's `full` prefill (which also writes the KV into its pages)
against `transformers`' forward pass of the same model (its default attention, `sdpa`, with
`use_cache=True` so it also builds the KV cache, and only the last position's logits), one
after the other per repetition so that drift hits both alike. It checks that both give the same
next-token logits before timing.

Prompts: the turns of each workload file's first sessions, spread over their lengths.

    python benchmarks/reuse/full_baseline.py \
        benchmarks/workloads/{reflexion,memgpt,swe_agent}.jsonl \
        --out docs/bench/full-baseline
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.results import write_run
from agentcache.model.loading import (
    LoadedModel,
    convert_default_model,
    default_cache_dir,
    load_model,
)
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.workload.files import load_workload


@dataclass(frozen=True)
class Timing:
    prompt: str  # session:turn
    tokens: int
    engine_ms: float  # median over repetitions
    hf_ms: float
    ratio: float  # engine / transformers (lower is faster)
    max_logit_diff: float  # last position, engine vs transformers


def hf_forward(hf: Any, ids: torch.Tensor) -> torch.Tensor:
    out = hf(ids, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


def time_prompt(
    engine: Engine, hf: Any, prompt: TokenizedPrompt, name: str, repeats: int
) -> Timing:
    ids = torch.tensor([prompt.ids])
    with torch.inference_mode():
        seq, result = engine.prefill(prompt, "full")
        ours = result.logits.float()
        seq.free()
        theirs = hf_forward(hf, ids).float()
    diff = float((ours - theirs).abs().max())
    a, b = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        seq, _ = engine.prefill(prompt, "full")
        a.append(time.perf_counter() - t)
        seq.free()
        with torch.inference_mode():
            t = time.perf_counter()
            hf_forward(hf, ids)
            b.append(time.perf_counter() - t)
    e, h = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    return Timing(name, prompt.num_tokens, e, h, e / h, diff)


def pick_prompts(
    engine: Engine, files: Sequence[Path], sessions: int, per_file: int
) -> list[tuple[str, TokenizedPrompt]]:
    """`per_file` turns of each file's first `sessions` sessions, spread over their lengths."""
    picked = []
    for f in files:
        loaded = load_workload(f)
        turns = [
            (f"{s.name}:{i}", engine.tokenize(t.prompt))
            for s in loaded.sessions[:sessions]
            for i, t in enumerate(s.turns)
        ]
        turns.sort(key=lambda x: x[1].num_tokens)
        if per_file >= len(turns):
            picked += turns
            continue
        step = (len(turns) - 1) / max(1, per_file - 1)
        picked += [turns[round(i * step)] for i in range(per_file)]
    return picked


def run(
    model: LoadedModel, hf: Any, prompts: list[tuple[str, TokenizedPrompt]], repeats: int
) -> list[Timing]:
    engine = Engine(model, EngineConfig(strategy="full"))
    out = []
    for i, (name, p) in enumerate(prompts):
        out.append(time_prompt(engine, hf, p, name, repeats))
        t = out[-1]
        print(
            f"[{i + 1}/{len(prompts)}] {name}: {t.tokens} tokens, engine {t.engine_ms:.0f} ms, "
            f"transformers {t.hf_ms:.0f} ms ({t.ratio:.2f}x)",
            file=sys.stderr,
        )
    return out


def report(timings: list[Timing], command: str) -> str:
    ratios = [t.ratio for t in timings]
    lines = [
        "# `full` against `transformers`",
        "",
        f"Command: `{command}`",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}. "
        "Median of the repetitions per prompt; ratio = agentcache `full` / `transformers`.",
        "",
        "| prompt | tokens | agentcache full (ms) | transformers (ms) | ratio | max logit diff |",
        "|---|---|---|---|---|---|",
    ]
    for t in timings:
        lines.append(
            f"| {t.prompt} | {t.tokens} | {t.engine_ms:.0f} | {t.hf_ms:.0f} | {t.ratio:.2f} "
            f"| {t.max_logit_diff:.1e} |"
        )
    lines += [
        "",
        f"Median ratio {statistics.median(ratios):.2f} (range {min(ratios):.2f}-"
        f"{max(ratios):.2f}) over {len(timings)} prompts.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workloads", nargs="+", type=Path)
    p.add_argument("--sessions", type=int, default=2, help="first N sessions per file")
    p.add_argument("--per-file", type=int, default=3, help="prompts per file")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.per_file < 1 or args.sessions < 1:
        p.error("--repeats, --per-file and --sessions must be >= 1")
    from transformers import AutoModelForCausalLM

    model = load_model()
    folder = convert_default_model(default_cache_dir())
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = pick_prompts(Engine(model), args.workloads, args.sessions, args.per_file)
    timings = run(model, hf, prompts, args.repeats)
    given = sys.argv[1:] if argv is None else list(argv)
    command = "python benchmarks/reuse/full_baseline.py " + " ".join(given)
    results = {"command": command, "timings": [asdict(t) for t in timings]}
    write_run(args.out, results, lambda _: report(timings, command))
    print(f"wrote {args.out}/results.json and report.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
