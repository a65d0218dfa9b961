"""`agentcache bench-decode`, and the run record every decode benchmark shares."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agentcache.argtypes import non_negative_int, output_folder, path_arg, positive_int
from agentcache.bench.provenance import machine, provenance
from agentcache.decode.config import DEFAULT_BUDGET_PAGES, DecodeConfig
from agentcache.decode.minmax import GQA_COMBINES
from agentcache.errors import AgentCacheError, ProfileError
from agentcache.heads.cli import add_prompt_options, check_context, make_profile
from agentcache.progress import progress_bar

if TYPE_CHECKING:  # the modules that build models and engines load with the command
    from agentcache.decode.setup import DecodeSetup
    from agentcache.model.loading import LoadedModel


def run_record() -> dict[str, Any]:
    """What every decode benchmark's results record of the run: its command and machine."""
    return {
        "command": "agentcache " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "provenance": provenance(),
    }


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    about = "compare decode policies (dense, flexicache, multiscale, ...) on long prompts"
    p = sub.add_parser("bench-decode", help=about, description=about)
    add_prompt_options(p, num_prompts=1)
    p.add_argument(
        "--context", type=positive_int, default=8192,
        help="KV length at the last step = prompt + new tokens (default 8192)",
    )  # fmt: skip
    p.add_argument(
        "--new-tokens", type=positive_int, default=256, help="generated tokens (default 256)"
    )
    p.add_argument(
        "--policies", default="dense,flexicache,multiscale",
        help="comma list; a policy may carry options, e.g. flexicache:verify=8:budget=96",
    )  # fmt: skip
    p.add_argument("--budget", type=positive_int, default=DEFAULT_BUDGET_PAGES, help="top-K pages")
    p.add_argument("--gqa", choices=GQA_COMBINES, default="sum", help="GQA combine")
    p.add_argument("--profile", type=path_arg, default=None, help="head profile JSON")
    p.add_argument("--no-teacher-forced", action="store_true", help="skip the forced runs")
    p.add_argument(
        "--needle", type=non_negative_int, default=0, metavar="N",
        help="also answer a planted-needle question with N tokens per policy (default off)",
    )  # fmt: skip
    p.add_argument(
        "--needle-prompts", type=non_negative_int, default=0, metavar="N",
        help="N needle prompts (depths 0.1..0.9) decoded besides the prompts (default 0)",
    )  # fmt: skip
    p.add_argument("--out", type=path_arg, default=Path("bench-decode-out"), help="output folder")
    return p


def run_bench(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    from agentcache.bench.decode.bench import DecodeBenchSettings, run_decode_bench
    from agentcache.bench.decode.report import table, write_report
    from agentcache.heads.prompts import load_texts, token_prompts
    from agentcache.model.loading import load_model

    console = Console(stderr=True)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    try:  # every spec checked, with the command's settings, before anything loads
        configs = {spec: DecodeConfig.from_spec(
            spec, budget_pages=args.budget, gqa_combine=args.gqa, profile=args.profile,
            profile_dir=cache_dir / "profiles",
        ) for spec in policies}  # fmt: skip
        settings = DecodeBenchSettings(
            args.context, args.new_tokens, policies,
            args.budget, args.gqa, not args.no_teacher_forced, args.needle, args.needle_prompts,
        )  # fmt: skip
    except ValueError as e:
        raise AgentCacheError(str(e)) from e
    check_budgets(configs, settings.context)
    texts = load_texts(args.prompts)
    if args.profile is not None and not args.profile.is_file():
        raise ProfileError(
            f"--profile {args.profile} is not a file; make one with "
            f"`agentcache profile-heads --out {args.profile}` or leave --profile out"
        )
    output_folder(args.out, "--out")
    model = load_model(model_path, cache_dir)
    check_context(settings.context, model.config.max_position_embeddings, "--context")
    setups = resolve_setups(model, configs, texts, settings.prompt_tokens, console)
    prompts = token_prompts(model, texts, settings.prompt_tokens, args.num_prompts)

    sparse = [p for p in settings.policies if p != "dense"]
    forced = [p for p in sparse if not configs[p].verify]
    runs = 1 + len(sparse) + (len(forced) if settings.teacher_forced else 0)
    with progress_bar(console) as progress:
        steps = runs * (settings.new_tokens - 1) * (len(prompts) + settings.needle_prompts)
        needle = (1 + len(sparse)) * max(settings.needle_tokens - 1, 0)
        task = progress.add_task("bench-decode", total=steps + needle)
        results = run_decode_bench(
            model, prompts, settings, setups, lambda _: progress.advance(task), texts
        )
    results.update(
        model=model.model_id,
        num_prompts=len(prompts) + settings.needle_prompts,
        settings={**asdict(settings), "prompt_tokens": settings.prompt_tokens},
        **run_record(),
    )
    write_report(args.out, results)
    print(table(results["policies"]))
    print(f"\nwrote {args.out}/results.json, report.md and decode.png")
    return 0


def check_budgets(configs: dict[str, DecodeConfig], context: int) -> None:
    """A sparse policy's budget must fit the pages it can rank at the last step (all but the
    sink and the recent pages)."""
    from agentcache.bench.decode.bench import PAGE

    pages = -(-context // PAGE)
    for spec, c in configs.items():
        most = pages - 1 - c.recent_pages
        if c.policy != "dense" and c.budget_pages > most:
            raise AgentCacheError(
                f"{spec}: a budget of {c.budget_pages} pages exceeds the {most} pages it can "
                f"rank at a {context}-token context ({pages} pages less the sink and "
                f"{c.recent_pages} recent); lower --budget to at most {most} "
                "(that budget attends every page)"
            )


PROFILE_TOKENS = 4096  # profile-heads' default prompt length


def resolve_setups(
    model: LoadedModel,
    configs: dict[str, DecodeConfig],
    texts: list[str],
    prompt_tokens: int,
    console: Console,
) -> dict[str, DecodeSetup]:
    """Each spec's plan; a policy needing a head profile where none exists (no --profile)
    gets one first, profiled on prompts cut from `texts` and stored where the engine looks."""
    from agentcache.decode.policies import DECODE_POLICIES
    from agentcache.decode.profiler import ProfileSettings
    from agentcache.decode.setup import DecodeSetup, profile_path

    needs = [c for c in configs.values() if DECODE_POLICIES.get(c.policy).needs_profile]
    path = profile_path(needs[0], model.model_id) if needs else None
    if path is not None and needs[0].profile is None and not path.exists():
        c = needs[0]
        settings = ProfileSettings(budget_pages=c.budget_pages, gqa_combine=c.gqa_combine)
        tokens = min(PROFILE_TOKENS, prompt_tokens)
        console.print(
            f"no head profile for model {model.model_id} at {path}: profiling its heads "
            f"first (2 prompts x {tokens} tokens, {settings.steps} steps)",
            soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
        try:
            settings.check_prompt(tokens)
        except ValueError as e:
            raise AgentCacheError(f"cannot profile the heads: {e}; pass --profile") from e
        make_profile(model, texts, settings, (tokens, 2), path, console)
    return {spec: DecodeSetup.resolve(model, c) for spec, c in configs.items()}
