#!/usr/bin/env python3
"""Short turns under a sparse decode policy: the sparse decoder built anyway against the
dense decode the engine now gives them, against dense itself, decode tokens/s within one run.

    python benchmarks/decode/short_turns.py --contexts 256 512 1000 --new-tokens 48 \
        --repeats 5 --threads 1 \
        --profile docs/bench/decode/smollm2-135m-instruct-18ddc7c854863b5228beb2a367be0eaa.json \
        --out docs/bench/decode/short-turns

A turn whose prompt and new tokens fill no more pages than the decode budget covers would
have its sparse decoder attend every page and offload none (`DecodeSetup.short_reason`); the
engine decodes it densely and counts a fallback (`DecodeConfig.short_dense`, default on). Per
context (a prompt of the swe_agent workload's texts cut to that many tokens, then a question),
one turn alone on each engine: `dense`, and each sparse policy twice, as the engine runs it
(`<policy>`, dense when short) and with `short_dense=False` (`<policy> built`: the sparse
decoder built, its budget clamped to every page). `full` prefill, greedy, nothing committed;
every engine in turn within a repeat, the order rotated from repeat to repeat, so that a
configuration's decode tokens/s over dense's (`TurnStats.decode_tokens_per_s`: the decoder's
set-up included, prefill excluded) is a ratio within one repeat. Each turn's greedy ids are
compared with dense's in the same repeat. Writes results.json (with provenance) and
report.md under --out.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentcache.bench.provenance import provenance, provenance_line
from agentcache.bench.results import write_run
from agentcache.decode.config import DecodeConfig
from agentcache.heads.prompts import load_texts, text_of_tokens
from agentcache.model.loading import LoadedModel, load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "swe_agent.jsonl"
QUESTION = "Which file should be changed first, and why?"


def prompt(model: LoadedModel, texts: list[str], tokens: int) -> SegmentedPrompt:
    """The first `tokens` tokens of `texts` (a system segment), then the question."""
    doc = text_of_tokens(model, texts, tokens)
    return SegmentedPrompt([Segment(SegmentKind.SYSTEM, doc, "doc", "system"),
                            Segment(SegmentKind.UPDATE, QUESTION, "q", "user")])  # fmt: skip


def configs(policies: list[str], profile: Path) -> dict[str, DecodeConfig]:
    out = {"dense": DecodeConfig()}
    for p in policies:
        out[p] = DecodeConfig.from_spec(p, profile=profile)
        out[f"{p} built"] = DecodeConfig.from_spec(p, profile=profile, short_dense=False)
    return out


def measure(
    model: LoadedModel, prompts: dict[int, SegmentedPrompt], decode: dict[str, DecodeConfig],
    new_tokens: int, repeats: int,
) -> list[dict[str, Any]]:  # fmt: skip
    engines = {n: Engine(model, EngineConfig(strategy="full", decode=d)) for n, d in decode.items()}
    params = GenerationParams(max_new_tokens=new_tokens)
    names = list(engines)
    first = next(iter(prompts.values()))
    for e in engines.values():  # warm-up: kernels chosen, caches filled (untimed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the built decoders' clamping warning
            e.generate(first, params, commit=False)
    runs = []
    for r in tqdm(range(repeats), desc="repeats"):
        order = names[r % len(names) :] + names[: r % len(names)]
        for context, p in prompts.items():
            for name in order:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    g = engines[name].generate(p, params, commit=False)
                s = g.stats
                runs.append({"repeat": r, "context": context, "config": name,
                             "prompt_tokens": s.prompt_tokens,
                             "decode_tokens_per_s": s.decode_tokens_per_s,
                             "decode_policy": s.decode_policy,
                             "decode_fallbacks": s.decode_fallbacks,
                             "decode_fallback_reason": s.decode_fallback_reason,
                             "sparse": s.decode is not None,
                             "ids": list(g.token_ids)})  # fmt: skip
    return runs


def summarize(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per context and configuration: decode tokens/s over dense's within each repeat (median,
    range), decode tokens/s (median), whether a sparse decoder ran, and the repeats whose
    greedy ids equal dense's."""
    dense = {(r["repeat"], r["context"]): r for r in runs if r["config"] == "dense"}
    out: dict[str, Any] = {}
    for context in sorted({r["context"] for r in runs}):
        row: dict[str, Any] = {}
        for n in names:
            rs = [r for r in runs if r["config"] == n and r["context"] == context]
            ratios = [r["decode_tokens_per_s"] / dense[r["repeat"], context]["decode_tokens_per_s"]
                      for r in rs]  # fmt: skip
            row[n] = {"prompt_tokens": rs[0]["prompt_tokens"],
                      "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratio_max": max(ratios), "ratios": ratios,
                      "tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in rs),
                      "sparse": [r["sparse"] for r in rs],
                      "fallbacks": sum(r["decode_fallbacks"] for r in rs),
                      "equal_ids": sum(r["ids"] == dense[r["repeat"], context]["ids"]
                                       for r in rs), "n": len(rs)}  # fmt: skip
        out[str(context)] = row
    return out


def report(results: dict[str, Any]) -> str:
    lines = [
        "# Short turns under a sparse decode policy",
        "",
        provenance_line(results["provenance"]),
        "",
        f"Model `{results['model']}`, {results['threads']} torch thread(s), one turn alone per "
        f"engine, {results['new_tokens']} new tokens, greedy, `full` prefill, "
        f"{results['repeats']} repeats (engines in an order rotated per repeat). Ratio: decode "
        "tokens/s over `dense`'s on the same prompt in the same repeat (the decoder's set-up "
        "included), median (range) over repeats. `built`: `DecodeConfig(short_dense=False)`, "
        "the sparse decoder built with its budget clamped to every page.",
        "",
        "| prompt tokens | configuration | sparse decoder | decode tokens/s (median) | "
        "over dense, median (range) | greedy ids equal to dense's |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["summary"].values():
        for n, v in row.items():
            sparse = "yes" if all(v["sparse"]) else "no" if not any(v["sparse"]) else "some"
            lines.append(
                f"| {v['prompt_tokens']} | `{n}` | {sparse} | {v['tokens_per_s']:.2f} | "
                f"{v['ratio']:.3f} ({v['ratio_min']:.3f}-{v['ratio_max']:.3f}) | "
                f"{v['equal_ids']} of {v['n']} |"
            )
    lines += ["", "Every turn's figures are in results.json."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1000])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--policies", default="flexicache,flexicache:verify=8")
    ap.add_argument("--profile", type=Path, required=True, help="head profile of the model")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if min(args.contexts) < 1 or args.new_tokens < 2 or args.repeats < 1:
        ap.error("--contexts >= 1, --new-tokens >= 2 (a sparse step), --repeats >= 1")
    torch.set_num_threads(args.threads)
    origin = provenance(script="benchmarks/decode/short_turns.py")
    model = load_model(None)
    texts = load_texts(WORKLOAD)
    prompts = {c: prompt(model, texts, c) for c in args.contexts}
    decode = configs(args.policies.split(","), args.profile)
    runs = measure(model, prompts, decode, args.new_tokens, args.repeats)
    results = {"provenance": origin, "model": model.model_id, "threads": args.threads,
               "repeats": args.repeats, "new_tokens": args.new_tokens,
               "contexts": args.contexts, "policies": args.policies, "runs": runs,
               "summary": summarize(runs, list(decode))}  # fmt: skip
    print(write_run(args.out, results, report))


if __name__ == "__main__":
    main()
