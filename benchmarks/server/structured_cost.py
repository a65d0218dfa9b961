"""Decode cost per token of structured outputs (llguidance constrained decoding) beside
unconstrained decode, on the default model, and the share of constrained replies that parse
and validate against their schema.

    PYTHONPATH=.:templates:adapters .venv/bin/python benchmarks/server/structured_cost.py \\
        --out docs/bench/server/structured [--schemas 12] [--max-tokens 48]

Per schema, the same prompt is decoded greedily with and without the schema's grammar,
interleaved (constrained, then unconstrained, per schema), so both modes see the same load.
Cost per token is the decode loop's own rate (TurnStats.decode.decode_tokens_per_s); the time
in the mask alone (`GrammarConstraint.allowed`) is timed apart. Timings on a shared machine
are noisy: compare the two modes' ratio within this run, never across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from agentcache.bench.provenance import load_average, provenance
from agentcache.bench.results import write_run
from agentcache.bench.server.schemas import SCHEMAS, validate
from agentcache.chat.messages import ChatMessage
from agentcache.chat.runner import ChatEngine, ChatRequest
from agentcache.chat.structured import GrammarConstraint, OutputFormat
from agentcache.model.loading import load_model
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

PROMPT = "Reply with a JSON value for this schema, nothing else:\n"


class Timed:
    """Wraps a constraint, timing each mask."""

    def __init__(self, inner: GrammarConstraint) -> None:
        self.inner, self.seconds = inner, []  # type: ignore[var-annotated]

    def allowed(self, ids: Any, logits: Any) -> Any:
        t0 = time.perf_counter()
        out = self.inner.allowed(ids, logits)
        self.seconds.append(time.perf_counter() - t0)
        return out


def run(
    chat: ChatEngine, name: str, schema: Any, max_tokens: int, constrained: bool
) -> dict[str, Any]:
    msg = ChatMessage("user", PROMPT + json.dumps(schema))
    params = GenerationParams(max_new_tokens=max_tokens)
    output = OutputFormat("json_schema", schema, "schema") if constrained else None
    prepared = chat.prepare(ChatRequest((msg,), params, output=output, strategy="full"))
    timer = None
    if constrained:
        from dataclasses import replace

        c = prepared.request.params.constraint
        assert isinstance(c, GrammarConstraint)
        timer = Timed(c)
        req = replace(prepared.request, params=replace(prepared.request.params, constraint=timer))
        prepared = replace(prepared, request=req)
    t0 = time.perf_counter()
    result = chat.run(prepared)
    wall = time.perf_counter() - t0
    stats = result.generation.stats
    row: dict[str, Any] = {
        "schema": name, "constrained": constrained, "tokens": result.completion_tokens,
        "decode_tokens_per_s": stats.decode_tokens_per_s, "wall_s": wall,
        "finish_reason": result.finish_reason,
    }  # fmt: skip
    if timer is not None:
        row["mask_ms_median"] = statistics.median(timer.seconds) * 1e3 if timer.seconds else None
        try:
            problem = validate(json.loads(result.content), schema)
            row["valid"], row["problem"] = problem is None, problem
        except ValueError as e:
            row["valid"], row["problem"] = False, f"not JSON: {e}"
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--schemas", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model = load_model(None)
    chat = ChatEngine(Engine(model, EngineConfig(strategy="full")))
    names = sorted(SCHEMAS)[: args.schemas]
    rows = []
    for name in names:
        for constrained in (True, False):
            rows.append(run(chat, name, SCHEMAS[name], args.max_tokens, constrained))
            print(json.dumps(rows[-1]))
    per_token = {
        mode: [1e3 / r["decode_tokens_per_s"] for r in rows
               if r["constrained"] == mode and r["decode_tokens_per_s"]]
        for mode in (True, False)
    }  # fmt: skip
    ratios = []
    for name in names:
        c = next(r for r in rows if r["schema"] == name and r["constrained"])
        u = next(r for r in rows if r["schema"] == name and not r["constrained"])
        if c["decode_tokens_per_s"] and u["decode_tokens_per_s"]:
            ratios.append(u["decode_tokens_per_s"] / c["decode_tokens_per_s"])
    masks = [r["mask_ms_median"] for r in rows if r.get("mask_ms_median") is not None]
    valid = [r for r in rows if r["constrained"]]
    summary = {
        "schemas": len(names), "max_tokens": args.max_tokens,
        "ms_per_token_constrained_median": statistics.median(per_token[True]),
        "ms_per_token_unconstrained_median": statistics.median(per_token[False]),
        "cost_ratio_median": statistics.median(ratios),
        "cost_ratio_min": min(ratios), "cost_ratio_max": max(ratios),
        "mask_ms_median_of_medians": statistics.median(masks),
        "valid_replies": sum(bool(r["valid"]) for r in valid),
        "cut_by_max_tokens": sum(r["finish_reason"] == "length" for r in valid),
        "constrained_replies": len(valid), "load_average": load_average(),
    }  # fmt: skip
    record = provenance(script="benchmarks/server/structured_cost.py")
    write_run(args.out, {"provenance": record, "summary": summary, "rows": rows})
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
