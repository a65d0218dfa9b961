"""What a replay phase measured, reduced to the figures the report gives.

Per phase (one target, one concurrency level, one round):

- throughput: prompt, computed-prompt (prompt - cached) and decode tokens per second of the
  phase's wall time, from the servers' usage (None where a server sends no usage);
- TTFT: client-measured p50/p99 of first turns (each session's turn 0) and of resumed turns
  (after a tool pause), and the same for the server's own prefill time where it reports one;
- job completion time per session (first request to last reply, pauses included), p50/p99;
- cached share: cached prompt tokens / prompt tokens;
- replies: each compared with the same session's reply alone on the same target (the solo
  phase); counts of compared, differing, and requests that failed.

Across rounds a level's figure is the median of its rounds'; a ratio to the reference target
is taken within each round (same N) before its median, so that load drifting between rounds
cancels out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from agentcache.bench.server.agents import Phase, TurnRecord
from agentcache.bench.stats import tail

COUNTER_KEYS = ("preemptions", "swapped_bytes", "spilled_bytes", "prefetched_pages",
                "promoted_pages")  # fmt: skip
RATIO_KEYS = ("decode_tok_s", "prompt_tok_s", "ttft_first_p99_s", "ttft_resumed_p50_s",
              "ttft_resumed_p99_s", "jct_p50_s")  # fmt: skip


def solo_replies(phase: Phase) -> dict[tuple[str, int], str]:
    """The replies of a solo phase by (session, turn)."""
    return {(r.session, r.turn): r.result.reply for r in phase.turns if r.result is not None}


def summarize_phase(
    phase: Phase, solo: dict[tuple[str, int], str], counters: dict[str, float | None]
) -> dict[str, Any]:
    """The figures of one phase (see the module docstring); `counters` its /metrics change."""
    ok = [r for r in phase.turns if r.result is not None]
    first = [r for r in ok if r.turn == 0]
    resumed = [r for r in ok if r.turn > 0]
    wall = phase.wall_s
    prompt, cached, decode = (_total(ok, k) for k in ("prompt_tokens", "cached_tokens",
                                                       "completion_tokens"))  # fmt: skip
    compared = [r for r in ok if (r.session, r.turn) in solo]
    differing = [r for r in compared if r.result and r.result.reply != solo[(r.session, r.turn)]]
    jct = tail(list(phase.jct_s.values()))
    ttft_first, ttft_resumed = _ttft(first, False), _ttft(resumed, False)
    return {
        "wall_s": wall,
        "requests": len(phase.turns), "ok": len(ok), "errors": len(phase.turns) - len(ok),
        "error_messages": [r.error for r in phase.turns if r.error][:20],
        "sessions_finished": len(phase.jct_s),
        "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": decode,
        "prompt_tok_s": _rate(prompt, wall), "decode_tok_s": _rate(decode, wall),
        "computed_prompt_tok_s": None if prompt is None or cached is None
        else _rate(prompt - cached, wall),
        "cached_share": None if not prompt or cached is None else cached / prompt,
        "ttft_first_s": ttft_first, "ttft_resumed_s": ttft_resumed,
        "ttft_first_p99_s": ttft_first["p99"], "ttft_resumed_p99_s": ttft_resumed["p99"],
        "ttft_resumed_p50_s": ttft_resumed["p50"],
        "server_ttft_first_s": _ttft(first, True), "server_ttft_resumed_s": _ttft(resumed, True),
        "jct_s": jct, "jct_p50_s": jct["p50"],
        "jct_by_session": {k: round(v, 4) for k, v in sorted(phase.jct_s.items())},
        "replies_compared": len(compared), "replies_differing": len(differing),
        "differing_turns": [[r.session, r.turn] for r in differing],
        "counters": counters,
    }  # fmt: skip


def _total(turns: Sequence[TurnRecord], key: str) -> int | None:
    values = [getattr(r.result, key) for r in turns]
    return None if not values or any(v is None for v in values) else sum(values)


def _rate(tokens: int | None, wall_s: float) -> float | None:
    return None if tokens is None or wall_s <= 0 else tokens / wall_s


def _ttft(turns: Sequence[TurnRecord], server: bool) -> dict[str, Any]:
    key = "server_ttft_s" if server else "ttft_s"
    values = [getattr(r.result, key) for r in turns]
    return tail([v for v in values if v is not None])


def median_over_rounds(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def level_table(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """target -> N (as text) -> each scalar figure's median over rounds, with the rounds'
    summed reply and error counts."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for target in dict.fromkeys(r["target"] for r in runs):
        for n in sorted({r["clients"] for r in runs if r["target"] == target}):
            rows = [r["summary"] for r in runs if r["target"] == target and r["clients"] == n]
            keys = (
                "wall_s",
                "prompt_tok_s",
                "computed_prompt_tok_s",
                "decode_tok_s",
                "cached_share",
                "ttft_first_p99_s",
                "ttft_resumed_p99_s",
                "jct_p50_s",
            )
            cell: dict[str, Any] = {k: median_over_rounds(rows, k) for k in keys}
            cell["ttft_first_p50_s"] = median_over_rounds([r["ttft_first_s"] for r in rows], "p50")
            cell["ttft_resumed_p50_s"] = median_over_rounds(
                [r["ttft_resumed_s"] for r in rows], "p50"
            )
            cell["server_ttft_resumed_p99_s"] = median_over_rounds(
                [r["server_ttft_resumed_s"] for r in rows], "p99"
            )
            for k in ("replies_compared", "replies_differing", "errors", "requests"):
                cell[k] = sum(r[k] for r in rows)
            for k in COUNTER_KEYS:
                cell[k] = median_over_rounds([r["counters"] for r in rows], k)
            cell["rounds"] = len(rows)
            table.setdefault(target, {})[str(n)] = cell  # fmt: skip
    return table


def ratios(runs: Sequence[dict[str, Any]], reference: str) -> dict[str, dict[str, dict[str, Any]]]:
    """target -> N -> for each of RATIO_KEYS, the median over rounds of target / `reference`
    in the same round and N (None where either is missing or the reference is 0)."""
    by = {(r["target"], r["clients"], r["round"]): r["summary"] for r in runs}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (target, n, rnd), mine in sorted(by.items()):
        ref = by.get((reference, n, rnd))
        if target == reference or ref is None:
            continue
        cell = out.setdefault(target, {}).setdefault(str(n), {k: [] for k in RATIO_KEYS})
        for k in RATIO_KEYS:
            if mine.get(k) is not None and ref.get(k):
                cell[k].append(mine[k] / ref[k])
    return {t: {n: {k: statistics.median(v) if v else None for k, v in c.items()}
                for n, c in levels.items()} for t, levels in out.items()}  # fmt: skip
