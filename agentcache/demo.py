"""`agentcache demo`: a support agent's session; each turn runs with full recompute and with
each reuse strategy, and the table compares TTFT, the cached KV each used and output fidelity.

Layout per turn (ChatML on the default model):

    [system: persona + policy][working memory][history: earlier turns ...][user: new message]
     static prefix             update: changes   fixed: reused, but shifted    update
                               length each turn  by the memory's new length
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentcache.bench.reuse.metrics import kl as first_token_kl
from agentcache.model.loading import load_model
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.runtime.stats import TurnStats

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

TICKETS = (
    "#4411 Droplet fra-1 unreachable 09:00-11:00 (network maintenance overran)",
    "#4412 duplicate Bucket charge $3.20 on the 14th",
    "#4413 migration request fra-1 -> tor-1, window Sunday 02:00",
    "#4414 data deletion request, Bucket archive-2023, awaiting written confirmation",
    "#4415 Tunnel quote requested",
)


def working_memory(turn: int) -> str:
    """The update segment before the history: its length changes every turn."""
    open_tickets = TICKETS[: 1 + (turn * 3) % len(TICKETS)]
    return (
        f"Working memory (turn {turn + 1}): customer Dana Ruiz, plan Business, "
        f"{len(open_tickets)} open tickets:\n" + "\n".join(open_tickets)
    )


def reply_segment(index: int) -> Callable[[str], Segment]:
    """The form a reply takes in the next turns' history, so its KV is stored when generated."""
    return lambda text: Segment(SegmentKind.FIXED, text, f"assistant-{index}", "assistant")


def build_prompt(turn: int, history: list[tuple[str, str]], user: str) -> SegmentedPrompt:
    segs = [
        Segment(SegmentKind.SYSTEM, SYSTEM, "system", "system"),
        Segment(SegmentKind.UPDATE, working_memory(turn), "memory", "user"),
    ]
    for i, (u, a) in enumerate(history):
        segs.append(Segment(SegmentKind.FIXED, u, f"user-{i}", "user"))
        segs.append(Segment(SegmentKind.FIXED, a, f"assistant-{i}", "assistant"))
    segs.append(Segment(SegmentKind.UPDATE, user, "user-new", "user"))
    return SegmentedPrompt(segs)


def run_demo(
    model: str | None, cache_dir: Path, strategies: list[str], turns: int, tokens: int
) -> int:
    console = Console(width=max(110, Console().width))
    from agentcache.bench.reuse.harness import StrategySpec

    specs = {s.label: s for s in map(StrategySpec.parse, strategies)}
    names = list(specs)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("loading model", total=None)
        loaded = load_model(model, cache_dir)
        engines = {"full": Engine(loaded, EngineConfig(strategy="full"))}
        for label, s in specs.items():
            config = EngineConfig(strategy=s.name, strategy_options={s.name: s.options})
            engines[label] = Engine(loaded, config)
        params = GenerationParams(max_new_tokens=tokens)
        progress.update(task, description="warming up")
        # the process's first forward pass pays one-off costs (allocator, thread pool): untimed
        first = build_prompt(0, [], USER_TURNS[0])
        engines["full"].generate(first, GenerationParams(max_new_tokens=1), commit=False)
        progress.update(task, description="agent turns", total=turns * len(engines))
        rows: list[dict[str, Generation]] = []
        history: list[tuple[str, str]] = []
        for i in range(turns):
            user = USER_TURNS[i % len(USER_TURNS)]
            prompt = build_prompt(i, history, user)
            row = {}
            reply = reply_segment(len(history))
            for name in turn_order(list(engines), i):
                row[name] = engines[name].generate(prompt, params, reply=reply)
                progress.advance(task)
            rows.append(row)
            history.append((user, row["full"].text))
    console.print(_table(loaded.model_id, names, rows))
    console.print(
        "kept = prompt tokens whose cached KV the turn used (at its own position or re-rotated): "
        "the compute it saved; +N = tokens found in the cache but recomputed for fidelity "
        "(they cost what computing them costs); KL = KL(full || strategy) of the first-token "
        "distribution; same = identical generated tokens."
    )
    console.print(f"last reply: {rows[-1]['full'].text!r}")
    return 0


def turn_order(names: list[str], turn: int) -> list[str]:
    """The engines' order on `turn`: rotated by one each turn, so that whatever the first run
    of a turn pays (caches the previous engine left cold) falls on each engine alike."""
    k = turn % len(names)
    return names[k:] + names[:k]


def kept_cell(s: TurnStats) -> str:
    """The share of the prompt whose cached KV the turn used as it was (`exact + moved`, the
    compute saved), then the found tokens it recomputed for fidelity (`refreshed`), if any."""
    refreshed = s.refreshed_tokens or 0
    kept = s.reused_tokens - refreshed
    cell = f"{kept / s.prompt_tokens:.0%}"
    return f"{cell} +{refreshed}" if refreshed else cell


def _table(model_id: str, names: list[str], rows: list[dict[str, Generation]]) -> Table:
    table = Table(title=f"agentcache demo on {model_id}: reuse vs full recompute, per turn")
    table.add_column("turn", justify="right")
    table.add_column("prompt", justify="right")
    table.add_column("TTFT full", justify="right")
    for n in names:
        for col in (f"{n} kept", f"{n} TTFT", f"{n} KL", f"{n} same"):
            table.add_column(col, justify="right")
    for i, row in enumerate(rows):
        ref = row["full"]
        cells = [str(i + 1), str(ref.stats.prompt_tokens), f"{ref.stats.ttft_s * 1e3:.0f} ms"]
        for n in names:
            s = row[n].stats
            kl = float(first_token_kl(ref.first_token_logits, row[n].first_token_logits))
            cells += [
                kept_cell(s),
                f"{s.ttft_s * 1e3:.0f} ms ({ref.stats.ttft_s / s.ttft_s:.1f}x)",
                f"{kl:.0e}",
                "yes" if row[n].token_ids == ref.token_ids else "no",
            ]
        table.add_row(*cells)
    return table
