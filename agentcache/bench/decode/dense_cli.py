"""`agentcache bench-dense-decode`: results.json and report.md (see `bench.decode.dense`)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from agentcache.argtypes import output_folder, path_arg, positive_int
from agentcache.bench.decode.cli import run_record
from agentcache.bench.results import write_run
from agentcache.errors import AgentCacheError
from agentcache.heads.cli import add_prompt_options


def _contexts(value: str) -> tuple[int, ...]:
    parts = [v.strip() for v in value.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"must be a comma list of integers >= 1, got {value!r}")
    return tuple(int(p) for p in parts)


def add_dense_parser(sub: Any) -> argparse.ArgumentParser:
    about = "the engine's dense decode against transformers' generate, at several contexts"
    p = sub.add_parser("bench-dense-decode", help=about, description=about)
    add_prompt_options(p, num_prompts=2, each=" per context")
    p.add_argument(
        "--contexts", type=_contexts, default=(1024, 4096, 8192),
        help="comma list of prompt + new tokens (default 1024,4096,8192)",
    )  # fmt: skip
    p.add_argument("--new-tokens", type=positive_int, default=64, help="per run (default 64)")
    p.add_argument("--out", type=path_arg, default=Path("bench-dense-decode-out"), help="folder")
    return p


def run_dense(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    from agentcache.bench.decode.dense import DenseBenchSettings, run_dense_bench
    from agentcache.bench.decode.report import dense_table, render_dense
    from agentcache.heads.prompts import load_texts, token_prompts
    from agentcache.model.loading import load_model

    try:
        settings = DenseBenchSettings(args.contexts, args.new_tokens, args.num_prompts)
    except ValueError as e:
        raise AgentCacheError(str(e)) from e
    texts = load_texts(args.prompts)
    output_folder(args.out, "--out")
    model = load_model(model_path, cache_dir)
    most = max(settings.contexts)
    if most > model.config.max_position_embeddings:
        raise AgentCacheError(
            f"--contexts {most} exceeds the model's {model.config.max_position_embeddings} "
            "positions"
        )
    hf = _hf_model(model_path, cache_dir)
    n = settings.new_tokens
    prompts = {
        c: token_prompts(model, texts, c - n, settings.num_prompts) for c in settings.contexts
    }
    console = Console(stderr=True)
    with console.status("bench-dense-decode") as status:
        done = [0]

        def step(path: str) -> None:
            done[0] += 1
            status.update(f"bench-dense-decode: {done[0]} steps ({path})")

        contexts = run_dense_bench(model, hf, prompts, settings, step)
    results = {
        "model": model.model_id,
        **run_record(),
        "settings": asdict(settings),
        "contexts": contexts,
    }
    write_run(args.out, results, render_dense)
    print(dense_table(contexts))
    print(f"\nwrote {args.out}/results.json and report.md")
    return 0


def _hf_model(model_path: str | None, cache_dir: Path) -> Any:
    """The same checkpoint as a `transformers` model (the default model's converted folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentcache.model.loading import DEFAULT_MODEL, convert_default_model

    default = model_path is None or model_path in ("default", DEFAULT_MODEL)
    folder = convert_default_model(cache_dir) if default else Path(str(model_path))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
