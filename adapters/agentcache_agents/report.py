"""Per-turn table of an agent loop's model calls: reuse, TTFT and fallbacks."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from agentcache_agents.loop import AgentLoop, TurnRecord


def turn_table(title: str, records: Sequence[TurnRecord]) -> Table:
    table = Table(title=title)
    for col in ("turn", "purpose", "prompt", "reused", "recomputed", "reused %", "TTFT"):
        table.add_column(col, justify="left" if col == "purpose" else "right")
    table.add_column("missed")
    table.add_column("fallback")
    for r in records:
        table.add_row(
            str(r.index + 1), r.purpose, str(r.prompt_tokens), str(r.reused_tokens),
            str(r.recomputed_tokens), f"{r.reused_tokens / r.prompt_tokens:.0%}",
            f"{r.ttft_s * 1e3:.0f} ms", ", ".join(f"{m.segment_id}:{m.reason}" for m in r.misses),
            r.fallback or "",
        )  # fmt: skip
    return table


def summary_line(loop: AgentLoop) -> str:
    calls = len(loop.records)
    reasons = ", ".join(f"{n} x {why}" for why, n in sorted(loop.fallbacks.items())) or "none"
    later = loop.records[1:]
    reused = sum(r.reused_tokens for r in later)
    prompt = sum(r.prompt_tokens for r in later) or 1
    return (
        f"{calls} model calls; turns 2+ reused {reused}/{prompt} prompt tokens "
        f"({reused / prompt:.0%}); fallbacks: {loop.num_fallbacks} ({reasons})"
    )
