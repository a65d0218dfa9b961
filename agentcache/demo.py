"""`agentcache demo`: a support agent's session, each turn run with full recompute and with reuse.

Layout per turn (ChatML on the default model):

    [system: persona + policy][history: earlier user/assistant turns ...][user: new message]
     reused                    reused (fixed, grows)                      computed (update)
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentcache.model.loading import load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams

SYSTEM = (
    "You are Atlas, the support agent of a small cloud-hosting company. Be brief and concrete. "
    "Policy: refunds are possible within 30 days of a charge; outages are credited at 10% of the "
    "monthly bill per hour of downtime; a customer's data is never deleted without a written "
    "request; escalate legal questions to a human. Products: Droplet (VM, from $5/month), "
    "Bucket (object storage, $0.02/GB), Tunnel (private network, $10/month). Data centres: "
    "Frankfurt, Toronto, Singapore. Always answer with the next concrete step for the customer."
)

USER_TURNS = (
    "Hi, my Droplet in Frankfurt has been unreachable since 9am. What should I do?",
    "It came back at 11am. Can I get a credit for the two hours of downtime?",
    "My monthly bill is $40. How much will the credit be?",
    "Also, I was charged twice for a Bucket last week. Can that be refunded?",
    "Please move my Droplet to Toronto, where most of my users are.",
    "Finally, delete all my old Bucket data from last year, please.",
    "What is the cheapest way to connect the Droplet and the Bucket privately?",
    "Thanks. Summarise what we agreed today in one sentence.",
)


def build_prompt(history: list[tuple[str, str]], user: str) -> SegmentedPrompt:
    segs = [Segment(SegmentKind.SYSTEM, SYSTEM, "system", "system")]
    for i, (u, a) in enumerate(history):
        segs.append(Segment(SegmentKind.FIXED, u, f"user-{i}", "user"))
        segs.append(Segment(SegmentKind.FIXED, a, f"assistant-{i}", "assistant"))
    segs.append(Segment(SegmentKind.UPDATE, user, "user-new", "user"))
    return SegmentedPrompt(segs)


def first_token_kl(ref: torch.Tensor, other: torch.Tensor) -> float:
    p = torch.log_softmax(ref.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    return float((p.exp() * (p - q)).sum())


def run_demo(
    model: str | None, cache_dir: Path, strategy: str | None, turns: int, tokens: int
) -> int:
    console = Console(width=max(100, Console().width))
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("loading model", total=None)
        loaded = load_model(model, cache_dir)
        engine = Engine(loaded, EngineConfig(strategy=strategy or EngineConfig.strategy))
        name = engine.config.strategy
        params = GenerationParams(max_new_tokens=tokens)
        progress.update(task, description=f"agent turns (full vs {name})", total=turns)
        rows = []
        history: list[tuple[str, str]] = []
        for i in range(turns):
            user = USER_TURNS[i % len(USER_TURNS)]
            prompt = build_prompt(history, user)
            ref = engine.generate(prompt, params, strategy="full", commit=False)
            out = engine.generate(prompt, params, strategy=name)
            rows.append(
                (i + 1, ref, out, first_token_kl(ref.first_token_logits, out.first_token_logits))
            )
            history.append((user, out.text))
            progress.advance(task)
    table = Table(title=f"agentcache demo: {loaded.model_id}, strategy {name!r} vs full recompute")
    for col in ("turn", "prompt", "reused", "TTFT full", f"TTFT {name}", "speed-up",
                "KL(first tok)", "same out"):  # fmt: skip
        table.add_column(col, justify="right")
    for turn, ref, out, kl in rows:
        s = out.stats
        table.add_row(
            str(turn), str(s.prompt_tokens), f"{s.reused_tokens / s.prompt_tokens:.0%}",
            f"{ref.stats.ttft_s * 1e3:.0f} ms", f"{s.ttft_s * 1e3:.0f} ms",
            f"{ref.stats.ttft_s / s.ttft_s:.2f}x", f"{kl:.1e}",
            "yes" if ref.token_ids == out.token_ids else "no",
        )  # fmt: skip
    console.print(table)
    console.print(f"last reply: {rows[-1][2].text!r}")
    console.print(f"store: {engine.store.stats}")
    return 0
