#!/usr/bin/env python3
"""End-to-end fidelity of `agentcache serve`: the chat workload's sessions sent through the real
`openai` client to a server running the default strategy and to one running `--strategy full`;
replies compared turn by turn.

    python benchmarks/server/fidelity.py --sessions chat-09,chat-11,chat-13,chat-15 \
        --out docs/bench/server/fidelity-tool-use

Each session's turns are the message lists (and tools) an OpenAI client sent, as in
`agentcache bench` on a chat workload: both servers receive the same requests, greedy
(temperature 0), each request echoing the conversation token the server returned before.
Reported per strategy: replies (text and tool calls) identical to full recompute's, the share
of prompt tokens reused on warm turns (`usage.prompt_tokens_details.cached_tokens`), and
request latency against full's. Writes results.json and report.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agentcache.bench.provenance import provenance, specs_of
from agentcache.bench.results import write_run

ROOT = Path(__file__).resolve().parents[2]


def split_of(names: list[str]) -> str:
    """The split of session names `NAME-NN` (NN < 8: tuning; benchmarks/workloads/README.md)."""
    splits = {"tune" if int(n.rsplit("-", 1)[1]) < 8 else "validate" for n in names}
    return splits.pop() if len(splits) == 1 else "mixed"


HEADER = "X-Agentcache-Conversation"


def load_sessions(path: Path, names: list[str]) -> list[dict[str, Any]]:
    sessions = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e})")
            sessions[s.get("name")] = s
    missing = [n for n in names if n not in sessions]
    if missing:
        sys.exit(f"{path}: no session named {', '.join(missing)}")
    return [sessions[n] for n in names]


def replay(url: str, session: dict[str, Any], max_tokens: int) -> list[dict[str, Any]]:
    """Send a session's turns to one server; each turn's reply, usage and latency."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    token: dict[str, str] = {}
    out = []
    for turn in session["turns"]:
        extra = {"tools": turn["tools"]} if turn.get("tools") else {}
        t0 = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model="agentcache", messages=turn["messages"], max_tokens=max_tokens,
            temperature=0, extra_headers=token, **extra,
        )  # fmt: skip
        latency = time.perf_counter() - t0
        token = {HEADER: raw.headers[HEADER.lower()]}
        reply = raw.parse()
        message = reply.choices[0].message
        calls = [c.model_dump() for c in message.tool_calls or ()]
        details = reply.usage.prompt_tokens_details
        out.append({
            "content": message.content, "tool_calls": calls,
            "finish_reason": reply.choices[0].finish_reason,
            "prompt_tokens": reply.usage.prompt_tokens,
            "cached_tokens": details.cached_tokens if details else 0,
            "latency_s": latency,
        })  # fmt: skip
    return out


def run_strategy(strategy: str, sessions: list[dict[str, Any]], args: argparse.Namespace) -> Any:
    import torch

    from agentcache.model.loading import load_model
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server import ServerConfig, create_app
    from agentcache.server.inprocess import serve_in_thread

    torch.set_num_threads(args.threads)
    engine = Engine(load_model(args.model), EngineConfig(strategy=strategy))
    app = create_app(engine, ServerConfig("agentcache", request_timeout_s=3600.0))
    results = []
    with serve_in_thread(app) as url:
        for s in tqdm(sessions, desc=f"{strategy}: sessions", unit="session"):
            results.append(replay(url, s, args.max_tokens))
    return results


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["content"] == b["content"] and [c["function"] for c in a["tool_calls"]] == [
        c["function"] for c in b["tool_calls"]
    ]


def summarize(names: list[str], runs: dict[str, Any]) -> dict[str, Any]:
    full = runs["full"]
    out: dict[str, Any] = {}
    for strategy, sessions in runs.items():
        identical = turns = 0
        reused, first_diff = [], []
        for name, got, ref in zip(names, sessions, full, strict=True):
            for i, (g, r) in enumerate(zip(got, ref, strict=True)):
                turns += 1
                if same(g, r):
                    identical += 1
                else:
                    first_diff.append(f"{name} turn {i}")
                if i:  # warm turns
                    reused.append(g["cached_tokens"] / g["prompt_tokens"])
        out[strategy] = {
            "turns": turns, "identical_to_full": identical,
            "differing_turns": first_diff,
            "warm_reused_fraction_median": statistics.median(reused),
            "warm_reused_fraction_min": min(reused),
            "warm_reused_tokens_share": sum(
                g["cached_tokens"] for s in sessions for g in s[1:]
            ) / sum(g["prompt_tokens"] for s in sessions for g in s[1:]),
            "latency_vs_full_median_warm": statistics.median(
                g["latency_s"] / r["latency_s"] for s, f in zip(sessions, full, strict=True)
                for g, r in zip(s[1:], f[1:], strict=True)
            ),
            "latency_vs_full_median_cold": statistics.median(
                s[0]["latency_s"] / f[0]["latency_s"] for s, f in zip(sessions, full, strict=True)
            ),
        }  # fmt: skip
    return out


def report(result: dict[str, Any], command: str) -> str:
    lines = [
        "# Server fidelity against full recompute", "",
        f"Command: `{command}`", "",
        f"Sessions: {', '.join(result['sessions'])} ({result['workload']}); "
        f"{result['max_tokens']} tokens per reply, temperature 0, {result['threads']} thread(s).",
        "",
        "| strategy | replies identical to full | warm turns: prompt tokens reused "
        "(all / median turn / min turn) | latency / full, warm (median) | cold (median) |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for strategy, s in result["summary"].items():
        lines.append(
            f"| {strategy} | {s['identical_to_full']} of {s['turns']} | "
            f"{s['warm_reused_tokens_share']:.0%} / {s['warm_reused_fraction_median']:.0%} / "
            f"{s['warm_reused_fraction_min']:.0%} | {s['latency_vs_full_median_warm']:.2f} | "
            f"{s['latency_vs_full_median_cold']:.2f} |"
        )
    differing = {
        k: v["differing_turns"] for k, v in result["summary"].items() if v["differing_turns"]
    }
    if differing:
        lines += ["", "Replies that differ from full's:", ""]
        lines += [f"- {k}: {', '.join(v)}" for k, v in differing.items()]
    lines += ["", "Every reply and its usage is in results.json."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", type=Path, default=ROOT / "benchmarks/workloads/chat.jsonl")
    p.add_argument("--sessions", default="chat-09,chat-11,chat-13,chat-15")
    p.add_argument("--strategy", default="default", help="the strategy compared with full")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="default")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.max_tokens < 1 or args.threads < 1:
        p.error("--max-tokens and --threads must be >= 1")
    names = [n for n in args.sessions.split(",") if n]
    sessions = load_sessions(args.workload, names)
    from agentcache.reuse import DEFAULT_STRATEGY

    strategy = DEFAULT_STRATEGY if args.strategy == "default" else args.strategy
    runs = {"full": run_strategy("full", sessions, args)}
    runs[strategy] = run_strategy(strategy, sessions, args)
    result = {
        "workload": str(args.workload.relative_to(ROOT) if args.workload.is_absolute()
                        and args.workload.is_relative_to(ROOT) else args.workload),
        "sessions": names, "max_tokens": args.max_tokens, "threads": args.threads,
        "default_strategy": DEFAULT_STRATEGY,
        "summary": summarize(names, runs), "replies": runs,
        "provenance": provenance(specs_of(runs), split_of(names), names,
                                 script="benchmarks/server/fidelity.py"),
    }  # fmt: skip
    command = (
        f"python benchmarks/server/fidelity.py --sessions {args.sessions} --strategy "
        f"{args.strategy} --max-tokens {args.max_tokens} --threads {args.threads} --out {args.out}"
    )
    print(write_run(args.out, result, lambda r: report(r, command)))


if __name__ == "__main__":
    main()
