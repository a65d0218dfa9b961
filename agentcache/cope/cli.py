"""`agentcache train-cope`: CoPE + LoRA adapter pre-training of a frozen model, resumable."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from agentcache.argtypes import output_file, path_arg, positive_float, positive_int

if TYPE_CHECKING:
    from torch import Tensor

    from agentcache.model.loading import LoadedModel


def add_parser(sub: Any) -> argparse.ArgumentParser:
    about = "train CoPE attention + LoRA adapters on a frozen model (resumable)"
    p = sub.add_parser("train-cope", help=about, description=about)
    p.add_argument("--steps", type=positive_int, default=500, help="optimizer steps (default 500)")
    p.add_argument(
        "--seq-len", type=positive_int, default=256, help="tokens per window (default 256)"
    )
    p.add_argument("--batch", type=positive_int, default=1, help="windows per step (default 1)")
    p.add_argument(
        "--lr", type=positive_float, default=7e-4, help="peak learning rate (default 7e-4)"
    )
    p.add_argument("--rank", type=positive_int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--max-position", type=positive_int, default=64, help="CoPE position cap P")
    p.add_argument(
        "--keep-rope", action="store_true", help="CoPE on top of RoPE instead of replacing it"
    )
    p.add_argument(
        "--checkpoint-every", type=positive_int, default=25, help="steps between checkpoints"
    )
    p.add_argument(
        "--eval-windows", type=positive_int, default=16, help="held-out windows for perplexity"
    )
    p.add_argument(
        "--max-corpus-tokens", type=positive_int, default=2_000_000, help="text read (tokens)"
    )
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument(
        "--checkpoint", type=path_arg, default=None, help="checkpoint file (default: cache)"
    )
    p.add_argument("--out", type=path_arg, default=None, help="write the run's figures as JSON")
    p.add_argument(
        "--eval-only", action="store_true", help="only measure the saved adapter's perplexity"
    )
    return p


def run(args: argparse.Namespace, model_path: str | None, cache_dir: Path) -> int:
    from agentcache.cope.checkpoint import adapter_path
    from agentcache.cope.data import documents, split_windows
    from agentcache.cope.train import TrainSettings, train
    from agentcache.model.cope import CoPEConfig
    from agentcache.model.loading import load_model

    console = Console(stderr=True)
    cope = CoPEConfig(args.max_position, args.keep_rope, args.rank, 2.0 * args.rank)
    settings = TrainSettings(
        steps=args.steps, seq_len=args.seq_len, batch=args.batch, lr=args.lr,
        checkpoint_every=args.checkpoint_every, eval_windows=args.eval_windows, cope=cope,
    )  # fmt: skip
    for option, path in (("--checkpoint", args.checkpoint), ("--out", args.out)):
        if path is not None and not args.eval_only:  # not after hours of training
            output_file(path, option)
    model = load_model(model_path, cache_dir)
    split = split_windows(documents(), model.tokenizer, args.seq_len, args.max_corpus_tokens)
    out = adapter_path(cache_dir, model.model_id)
    if args.eval_only:
        return evaluate(model, split.held_out, args.eval_windows, out, console)
    checkpoint = args.checkpoint or out.with_suffix(".train")
    console.print(
        f"{model.model_id}: {len(split.train)} train / {len(split.held_out)} held-out windows of "
        f"{args.seq_len} tokens; checkpoint {checkpoint}"
    )
    if args.resume and not checkpoint.is_file():
        console.print(f"[yellow]--resume: no checkpoint at {checkpoint}; starting from step 0")
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  {task.fields[rate]:.2f} steps/s"),
        TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train-cope", total=settings.steps, loss=float("nan"), rate=0.0)
        clock: dict[str, float] = {}

        def on_step(step: int, loss: float) -> None:
            import time

            now = time.perf_counter()
            first = clock.setdefault("t0", now), clock.setdefault("s0", step - 1)
            rate = (step - first[1]) / max(1e-9, now - first[0])
            progress.update(task, completed=step, loss=loss, rate=rate)
            if not console.is_terminal and step % 10 == 0:  # a log file gets plain lines
                console.log(f"step {step}/{settings.steps} loss {loss:.3f} {rate:.3f} steps/s")

        def on_phase(text: str) -> None:
            progress.update(task, description=text)

        result = train(model, split, settings, checkpoint, out, args.resume, on_step, on_phase)
    console.print(
        f"perplexity on {result.held_out_tokens} held-out tokens: base (RoPE) "
        f"{result.ppl_base:.2f}, CoPE untrained {result.ppl_untrained:.2f}, CoPE trained "
        f"{result.ppl_trained:.2f}; {result.steps} steps ({result.steps_per_second:.3f} steps/s "
        f"this run); adapter {result.adapter_path}"
    )
    if args.out is not None:
        figures = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(result).items()}
        figures["settings"] = settings.as_dict()
        figures["model_id"] = model.model_id
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        plot_history(checkpoint, args.out.with_suffix(".png"))
    return 0


def evaluate(model: LoadedModel, held_out: Tensor, n: int, adapter: Path, console: Console) -> int:
    from agentcache.cope.checkpoint import load_cope_adapter
    from agentcache.cope.train import eval_windows, perplexity

    windows = eval_windows(held_out, n)
    adapted = load_cope_adapter(model, path=adapter)  # a missing one fails before the base run
    with console.status(f"perplexity on {windows.numel()} held-out tokens"):
        base = perplexity(model.forward, windows)
        cope = perplexity(adapted.forward, windows)
    tokens = windows.numel()
    console.print(f"held-out perplexity ({tokens} tokens): base {base:.2f}, CoPE {cope:.2f}")
    return 0


def plot_history(checkpoint: Path, out: Path, smooth: int = 25) -> None:
    """Training loss per step (and its running mean over `smooth` steps) from a checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentcache.cope.checkpoint import read_payload, training_history

    history, evals = training_history(read_payload(checkpoint), checkpoint)
    steps = [s for s, _ in history]
    loss = [x for _, x in history]
    mean = [sum(loss[max(0, i - smooth + 1) : i + 1]) / len(loss[max(0, i - smooth + 1) : i + 1])
            for i in range(len(loss))]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, alpha=0.3, label="loss per step")
    ax.plot(steps, mean, label=f"running mean ({smooth} steps)")
    for name, style in (("base", "--"), ("untrained", ":"), ("trained", "-.")):
        if name in evals:
            ax.axhline(math.log(evals[name]), ls=style, color="k", lw=1, label=f"held-out {name}")
    ax.set(xlabel="step", ylabel="cross-entropy (nats)", title="CoPE + LoRA adapter training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
