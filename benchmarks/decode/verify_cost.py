"""What one round of verified sparse decode (`flexicache:verify=K`) costs, in dense steps.

A round is K sparse draft steps and one dense pass over the K drafted positions; it pays off
when the tokens it emits outweigh (K x sparse step + verify pass) / dense step. Per prompt this
times, as medians of `--repeats` calls on the same decoder state: the engine's dense step, a
sparse step, the verify pass over K tokens, and the two parts of that pass: its attention (the
K queries of each KV head over that head's full KV, a head at a time, as `SparseDecoder.verify`
calls it: `last_tokens_attention`; and the masked attention it replaced, for comparison) and
the rest (projections, MLP and logits for K tokens, and for 1 token to compare).

    python benchmarks/decode/verify_cost.py WORKLOAD --context 8192 --num-prompts 2 --profile P \
        --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.results import write_run
from agentcache.decode.config import DecodeConfig
from agentcache.decode.decoder import SparseDecoder
from agentcache.decode.kernels import last_tokens_attention
from agentcache.decode.setup import DecodeSetup
from agentcache.heads.prompts import load_texts, token_prompts
from agentcache.model.llama import attention
from agentcache.model.loading import LoadedModel, load_model
from agentcache.runtime.engine import Engine, EngineConfig


def median_s(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rest_of_forward(model: LoadedModel, n: int, position: int) -> Callable[[], object]:
    """Projections, MLP and logits of n tokens, attention left out (zeros)."""
    f, c = model.forward, model.forward.config
    hidden = f.embed(torch.zeros(n, dtype=torch.int64))
    positions = torch.arange(position, position + n)

    def run() -> object:
        h = hidden
        for layer in range(c.num_layers):
            f.project(layer, h, positions)
            h = f.finish(layer, h, torch.zeros(n, c.num_heads * c.head_dim))
        return f.logits(h)

    return run


def verify_attention(dec: SparseDecoder, n: int, masked: bool) -> Callable[[], object]:
    f, c = dec.f, dec.f.config
    g = c.num_heads // c.num_kv_heads
    q = torch.randn(n, c.num_heads, c.head_dim)

    def run() -> None:
        for layer in range(c.num_layers):
            for h in range(c.num_kv_heads):
                keys, values = dec.kv.full_kv(layer, h)
                qh = q[:, h * g : (h + 1) * g]
                if masked:
                    attention(qh, keys[:, None], values[:, None], None, f.scale)
                else:
                    last_tokens_attention(qh, keys, values, f.scale)

    return run


def one_prompt(
    model: LoadedModel, setup: DecodeSetup, engine: Engine, ids: Any, k: int, repeats: int
) -> dict[str, float]:
    seq, pre = engine.prefill(ids)
    try:
        keys, values = seq.gather_all(slice(0, seq.num_tokens))
        token, position = int(pre.logits.argmax()), int(pre.positions.max()) + 1
        steps = iter(range(10_000))
        dense = median_s(lambda: engine.step(seq, token, position + next(steps)), repeats)
    finally:
        seq.free()
    room = keys.shape[1] + 2 * repeats + k + 8
    dec = SparseDecoder(model.forward, setup.plan, setup.config, keys, values, room)
    steps = iter(range(10_000))
    sparse = median_s(lambda: dec.step(token, position + next(steps)), repeats + k)
    start = dec.kv.num_tokens - k
    last = position + (dec.kv.num_tokens - keys.shape[1]) - k
    verify = median_s(lambda: dec.verify([token] * k, start, last), repeats)
    return {
        "tokens": dec.kv.num_tokens,
        "dense_step_s": dense,
        "sparse_step_s": sparse,
        "verify_pass_s": verify,
        "verify_attention_s": median_s(verify_attention(dec, k, masked=False), repeats),
        "verify_attention_masked_s": median_s(verify_attention(dec, k, masked=True), repeats),
        "forward_rest_k_tokens_s": median_s(rest_of_forward(model, k, position), repeats),
        "forward_rest_1_token_s": median_s(rest_of_forward(model, 1, position), repeats),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompts", type=Path, help="text file or workload JSON Lines")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--num-prompts", type=int, default=2)
    p.add_argument("--draft", type=int, default=8, help="K, the verify option")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model()
    config = DecodeConfig("flexicache", profile=args.profile, verify=args.draft)
    setup = DecodeSetup.resolve(model, config)
    engine = Engine(model, EngineConfig(strategy="full", kv_pages=8 + args.context // 16))
    prompt_tokens = args.context - 2 * args.repeats - args.draft - 8
    prompts = token_prompts(model, load_texts(args.prompts), prompt_tokens, args.num_prompts)
    with torch.inference_mode():
        rows = [one_prompt(model, setup, engine, ids, args.draft, args.repeats) for ids in prompts]
    for row in rows:
        row["verify_pass_in_dense_steps"] = row["verify_pass_s"] / row["dense_step_s"]
        row["sparse_step_in_dense_steps"] = row["sparse_step_s"] / row["dense_step_s"]
    paths_as_text = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings = paths_as_text | {"torch_threads": 1}
    write_run(args.out, {"model": model.model_id, "settings": settings, "prompts": rows})
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
