#!/usr/bin/env python3
"""An unmodified OpenAI-client agent whose system prompt changes every turn, against
`agentcache serve` (default strategy) and `agentcache serve --strategy prefix`.

    HF_HUB_OFFLINE=1 python benchmarks/server/edits.py --out docs/bench/server/memgpt-client

The agent keeps working memory in its system message (MemGPT's core memory), rewritten and
longer every turn, and resends its whole history; it echoes no conversation token, only a
`prompt_cache_key`. The default server's replies drive the loop; each turn's message list goes
to both servers (interleaved), so their TTFTs compare on identical prompts. Then three
identical requests with a long system prompt. Reported per turn: prompt tokens, `cached_tokens`,
the history's tokens (messages before the last user message, the system message excluded)
found and kept (exact + moved: found and not recomputed), and TTFT on both servers. Writes
results.json and report.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import openai

from agentcache.bench.results import write_run
from agentcache.testing import ServeProcess

MODEL = "agentcache-default"
INSTRUCTIONS = (
    "You are Mira, a customer support agent for an online bookshop. You answer in at most two "
    "sentences, you never invent order details, and you keep the core memory below up to date: "
    "it is all you know about the customer beyond this conversation. "
)
USER_TURNS = (
    "Hi, I ordered 'The Left Hand of Darkness' last week and it has not arrived.",
    "The order number is 55120. I paid with a credit card.",
    "Can you tell me when it was shipped?",
    "I moved last month; maybe it went to my old address on Elm Street.",
    "Please send it to 14 Harbour Road instead.",
    "Also, do you have 'The Dispossessed' in paperback?",
    "Great, add it to the same shipment if you can.",
    "Thanks. What is the total now?",
)


class Server(ServeProcess):
    """`python -m agentcache serve` in a subprocess, ready when /health answers."""

    def __init__(self, extra: list[str], log: Path) -> None:
        super().__init__(extra, log, MODEL)

    def ask(self, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_body={"prompt_cache_key": "support-session-1"},
        )  # fmt: skip
        return r.model_dump()


def memory(turn: int) -> str:
    facts = [
        "Customer: Dana Whitfield, member since 2019.",
        "Order 55120: 'The Left Hand of Darkness', paid by card, shipped on the 3rd.",
        "Old address: 9 Elm Street. New address: 14 Harbour Road.",
        "Wants 'The Dispossessed' (paperback) added to order 55120.",
    ][: 1 + turn // 2]
    lines = "\n".join(f"- {f}" for f in facts)
    return f"{INSTRUCTIONS}\n<core_memory updated='turn {turn}'>\n{lines}\n</core_memory>"


def turn_row(body: dict[str, Any], n_messages: int) -> dict[str, Any]:
    rep = body["agentcache"]
    history = [s for s in rep["segments"]
               if s["message_index"] not in (None, 0, n_messages - 1)]  # fmt: skip
    found = sum(s["exact_tokens"] + s["moved_tokens"] + s["refreshed_tokens"] for s in history)
    kept = sum(s["exact_tokens"] + s["moved_tokens"] for s in history)
    return {
        "prompt_tokens": rep["prompt_tokens"],
        "cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"],
        "split": {k: rep[f"{k}_tokens"] for k in ("exact", "moved", "refreshed", "computed")},
        "history_tokens": sum(s["num_tokens"] for s in history),
        "history_found": found,
        "history_kept": kept,
        "ttft_s": rep["ttft_s"],
        "statuses": [s["status"] for s in rep["segments"]],
    }


def median_spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "servers.log"
    ours, prefix = Server([], log), Server(["--strategy", "prefix"], log)
    try:
        messages: list[dict[str, Any]] = [{"role": "system", "content": ""}]
        turns: list[dict[str, Any]] = []
        for t, user in enumerate(USER_TURNS):
            messages[0] = {"role": "system", "content": memory(t)}
            messages.append({"role": "user", "content": user})
            a = ours.ask(messages, args.max_tokens)
            b = prefix.ask(messages, args.max_tokens)
            turns.append({"turn": t, "default": turn_row(a, len(messages)),
                          "prefix": turn_row(b, len(messages))})  # fmt: skip
            messages.append({"role": "assistant", "content": a["choices"][0]["message"]["content"]})
        same: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS * 4},
                {"role": "user", "content": USER_TURNS[0]}]  # fmt: skip
        identical = [turn_row(ours.ask(same, 8), len(same)) for _ in range(3)]
    finally:
        ours.close()
        prefix.close()
    warm = [r for r in turns if r["turn"] > 0]
    summary = {
        "history_found_share": median_spread(
            [r["default"]["history_found"] / r["default"]["history_tokens"] for r in warm]
        ),
        "history_kept_share": median_spread(
            [r["default"]["history_kept"] / r["default"]["history_tokens"] for r in warm]
        ),
        "ttft_ratio_default_over_prefix": median_spread(
            [r["default"]["ttft_s"] / r["prefix"]["ttft_s"] for r in warm]
        ),
        "identical_requests_cached": [r["cached_tokens"] for r in identical],
    }
    results = {"command": " ".join(sys.argv), "turns": turns, "identical": identical,
               "summary": summary}  # fmt: skip
    print(write_run(args.out, results, render))
    return 0


def render(results: dict[str, Any]) -> str:
    lines = [
        "# A changing system prompt through the openai client", "",
        f"`{results['command']}`", "",
        "| turn | prompt | cached | exact / moved / refreshed / computed | history found / kept "
        "/ all | TTFT default / prefix (ms) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in results["turns"]:
        d, p = r["default"], r["prefix"]
        split = " / ".join(str(v) for v in d["split"].values())
        lines.append(
            f"| {r['turn']} | {d['prompt_tokens']} | {d['cached_tokens']} | {split} | "
            f"{d['history_found']} / {d['history_kept']} / {d['history_tokens']} | "
            f"{d['ttft_s'] * 1e3:.1f} / {p['ttft_s'] * 1e3:.1f} |"
        )
    s = results["summary"]
    for key, v in s.items():
        if isinstance(v, dict):
            lines.append(f"- {key}: median {v['median']:.3f} (n = {v['n']}, "
                         f"{v['min']:.3f}-{v['max']:.3f})")  # fmt: skip
    lines.append(f"- identical requests, cached_tokens: {s['identical_requests_cached']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
