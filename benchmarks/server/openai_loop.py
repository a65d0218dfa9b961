"""An unmodified OpenAI-client agent loop against `agentcache serve`: reuse and TTFT per turn,
each warm turn against a cold first turn of the same length, and 8 concurrent loops checked
against their solo runs (temperature 0).

    .venv/bin/python benchmarks/server/openai_loop.py --out docs/bench/openai-loop

The agent is a plain OpenAI chat loop: it resends its whole history each turn, passes its tools
in `tools`, answers tool calls with `tool` messages and otherwise adds the next observation as
a user message. It knows nothing of agentcache. The server runs in a subprocess
(`python -m agentcache serve`), one at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from rich.console import Console
from rich.progress import Progress

from agentcache.bench.results import write_run
from agentcache.testing import ServeProcess

MODEL = "agentcache-default"
SYSTEM = (
    "You are Forge, a software maintenance agent working in a Python repository. You solve "
    "one task at a time by calling tools and reading their output. Rules: read before you "
    "edit; run the tests after every change; never delete files you did not create; keep "
    "changes minimal and explain each one in one sentence; when the tests pass, reply with "
    "DONE and a summary of the change. The repository uses pytest, ruff and mypy; its layout "
    "is src/ for the package, tests/ for the tests and docs/ for the documentation. When a tool "
    "fails, read its error and try a different approach instead of repeating the same call."
)
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "path from the repository root"},
            "start": {"type": "integer", "description": "first line, 1-based"},
            "end": {"type": "integer", "description": "last line, inclusive"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run pytest on a path and return its report.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "keyword": {"type": "string"}}, "required": []}}},
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace one exact text span in a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"]}}},
]  # fmt: skip
OBSERVATIONS = (
    "Task: the function parse_duration in src/timeparse/core.py returns 0 for inputs like "
    "'1h30m'. Fix it so that hours, minutes and seconds combine, and keep the existing tests "
    "passing.",
    "read_file src/timeparse/core.py:\n"
    + "\n".join(
        f"{i:3d}  " + line
        for i, line in enumerate(
            (
                "import re",
                "",
                "_UNITS = {'h': 3600, 'm': 60, 's': 1}",
                "_PART = re.compile(r'^(\\d+)([hms])$')",
                "",
                "def parse_duration(text: str) -> int:",
                "    match = _PART.match(text.strip())",
                "    if match is None:",
                "        return 0",
                "    value, unit = match.groups()",
                "    return int(value) * _UNITS[unit]",
            ),
            1,
        )
    ),
    "run_tests tests/test_core.py:\n....F.\nFAILED tests/test_core.py::test_combined - "
    "assert parse_duration('1h30m') == 5400, got 0\n1 failed, 5 passed in 0.04s",
    "edit_file src/timeparse/core.py: replaced 1 span (the single-part regex by a findall "
    "over '(\\d+)([hms])' and a sum over the parts; empty input still returns 0).",
    "run_tests tests/test_core.py:\n......\n6 passed in 0.03s",
    "The reviewer asks: does '90s' still parse, and what happens with '1h 30m' (with a space)? "
    "Answer both before closing the task.",
    "run_tests tests/test_core.py -k space:\n.\n1 passed in 0.01s",
    "The reviewer approves. Write the final summary for the changelog in one sentence.",
)


@dataclass(frozen=True)
class Turn:
    turn: int
    prompt_tokens: int
    cached_tokens: int
    reused_fraction: float
    ttft_server_s: float  # prefill, from the response's `agentcache` report
    ttft_client_s: float  # request sent -> first content chunk (HTTP, segmenting included)
    misses: str
    text: str


class Server(ServeProcess):
    """`python -m agentcache serve` in a subprocess, ready when /health answers."""

    def __init__(self, threads: int, log: Path) -> None:
        super().__init__(["--threads", str(threads)], log, MODEL)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0,
                             timeout=600)  # fmt: skip


def request(
    client: openai.OpenAI,
    messages: list[dict[str, Any]],
    max_tokens: int,
    tools: list[dict[str, Any]] = TOOLS,
) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """Stream one completion; returns the assistant message, client TTFT and the report."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL, messages=messages, tools=tools, temperature=0,
        max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    first: float | None = None
    content, calls, report, usage = "", [], {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            first = first if first is not None else time.perf_counter() - t0
            content += delta.content
        if delta.tool_calls:
            first = first if first is not None else time.perf_counter() - t0
            calls = [c.model_dump(exclude={"index"}) for c in delta.tool_calls]
        if chunk.choices[0].finish_reason:
            report = (chunk.model_extra or {})["agentcache"]
            first = first if first is not None else time.perf_counter() - t0
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == report["reused_tokens"]
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message, float(first or 0.0), report


def agent_loop(
    client: openai.OpenAI,
    task: str,
    turns: int,
    max_tokens: int,
    prompts: list[list[dict[str, Any]]] | None = None,
) -> list[Turn]:
    """Run the loop; `prompts`, when given, receives each turn's prompt messages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    out = []
    for t in range(turns):
        observation = OBSERVATIONS[t % len(OBSERVATIONS)]
        last = messages[-1]
        if last.get("tool_calls"):  # answer every call; the observation is the tool's output
            for call in last["tool_calls"]:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": observation}
                )
        else:
            messages.append({"role": "user", "content": f"[{task}] {observation}"})
        if prompts is not None:
            prompts.append([dict(m) for m in messages])
        reply, ttft, report = request(client, messages, max_tokens)
        messages.append(reply)
        misses = ",".join(f"{s['role']}:{s['reason']}" for s in report["segments"]
                          if s["status"] == "miss")  # fmt: skip
        text = reply["content"] or json.dumps(reply.get("tool_calls"))
        r = report
        turn = Turn(t + 1, r["prompt_tokens"], r["reused_tokens"], r["reused_fraction"],
                    r["ttft_s"], ttft, misses, text)  # fmt: skip
        out.append(turn)
    return out


def cold_turn(client: openai.OpenAI, messages_of_turn: list[dict[str, Any]], nonce: int) -> Turn:
    """The same messages and tools behind a never-seen 4-digit tag in the system message and
    the first tool's description: a first turn of (almost) equal length, nothing reusable."""
    cold = [dict(m) for m in messages_of_turn]
    cold[0]["content"] = f"[{nonce:04d}] " + cold[0]["content"]
    tools = json.loads(json.dumps(TOOLS))
    tools[0]["function"]["description"] = f"[{nonce:04d}] " + tools[0]["function"]["description"]
    _, ttft, report = request(client, cold, max_tokens=1, tools=tools)
    assert report["reused_tokens"] == 0, report
    return Turn(0, report["prompt_tokens"], 0, 0.0, report["ttft_s"], ttft, "", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out/openai-loop"))
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--loops", type=int, default=8, help="concurrent loops")
    ap.add_argument("--loop-turns", type=int, default=6, help="turns per concurrent loop")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "server.log"
    console = Console()
    results: dict[str, Any] = {"command": " ".join(sys.argv)}
    t_start = time.perf_counter()

    server = Server(args.threads, log)
    try:
        client = server.client()
        console.print(f"[bold]agent loop[/]: {args.turns} turns on {server.url}")
        prompts: list[list[dict[str, Any]]] = []
        turns = agent_loop(client, "main", args.turns, args.max_tokens, prompts)
        colds = []
        with Progress(console=console) as progress:
            task = progress.add_task("cold first turns of equal length", total=len(prompts) - 1)
            for i, msgs in enumerate(prompts[1:], 1):
                colds.append(cold_turn(client, msgs, 1000 + i))
                progress.advance(task)
        metrics = httpx.get(f"{server.url}/metrics").text
    finally:
        server.close()
    results["loop"] = [asdict(t) for t in turns]
    results["cold"] = [asdict(c) for c in colds]
    (args.out / "metrics.txt").write_text(metrics)

    tasks = [f"task-{i}" for i in range(args.loops)]
    solo = []
    with Progress(console=console) as progress:
        task = progress.add_task("solo loops (fresh server each)", total=len(tasks))
        for name in tasks:
            s = Server(args.threads, log)
            try:
                solo.append([t.text for t in agent_loop(s.client(), name, args.loop_turns,
                                                         args.max_tokens)])  # fmt: skip
            finally:
                s.close()
            progress.advance(task)
    console.print(f"[bold]{args.loops} concurrent loops[/] on one server")
    s = Server(args.threads, log)
    errors: list[str] = []
    try:

        def run(name: str) -> list[str]:
            try:
                return [t.text for t in agent_loop(s.client(), name, args.loop_turns,
                                                   args.max_tokens)]  # fmt: skip
            except Exception as e:  # counted and reported, not hidden
                errors.append(f"{name}: {type(e).__name__}: {e}")
                return []

        with ThreadPoolExecutor(args.loops) as pool:
            together = list(pool.map(run, tasks))
    finally:
        s.close()
    same = [a == b for a, b in zip(solo, together, strict=True)]
    results["concurrent"] = {"loops": args.loops, "turns": args.loop_turns, "errors": errors,
                             "equal_to_solo": same}  # fmt: skip
    results["wall_s"] = time.perf_counter() - t_start
    report = write_run(args.out, results, lambda r: render(turns, colds, r))
    plot(turns, colds, args.out / "ttft.png")
    console.print(report)
    return 0 if not errors and all(same) else 1


def render(turns: list[Turn], colds: list[Turn], results: dict[str, Any]) -> str:
    lines = [
        "| turn | prompt tokens | reused | reused % | TTFT warm (ms) | TTFT cold, same length "
        "(ms) | cold/warm | client TTFT warm / cold (ms) | misses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for t in turns:
        c = colds[t.turn - 2] if t.turn > 1 else None
        ratio = c.ttft_server_s / t.ttft_server_s if c else None
        if ratio:
            ratios.append(ratio)
        cold = f"{1000 * c.ttft_server_s:.0f} ({c.prompt_tokens} tok)" if c else "-"
        client = f"{1000 * t.ttft_client_s:.0f}" + (f" / {1000 * c.ttft_client_s:.0f}" if c else "")
        lines.append(
            f"| {t.turn} | {t.prompt_tokens} | {t.cached_tokens} | {100 * t.reused_fraction:.0f} "
            f"| {1000 * t.ttft_server_s:.0f} | {cold} | {f'{ratio:.1f}x' if ratio else '-'} "
            f"| {client} | {t.misses or '-'} |"
        )
    later = [t.reused_fraction for t in turns[1:]]
    conc = results["concurrent"]
    lines += [
        "",
        f"Later turns (2-{len(turns)}): median reused {100 * statistics.median(later):.0f}% "
        f"(min {100 * min(later):.0f}%); median cold/warm TTFT {statistics.median(ratios):.1f}x "
        f"(min {min(ratios):.1f}x).",
        f"{conc['loops']} concurrent loops x {conc['turns']} turns: {len(conc['errors'])} errors, "
        f"{sum(conc['equal_to_solo'])}/{conc['loops']} equal to their solo runs.",
        f"Wall time {results['wall_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def plot(turns: list[Turn], colds: list[Turn], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([t.turn for t in turns], [1000 * t.ttft_server_s for t in turns], "o-",
            label="agent loop (warm)")  # fmt: skip
    ax.plot([t.turn for t in turns[1:]], [1000 * c.ttft_server_s for c in colds], "s--",
            label="cold first turn, same length")  # fmt: skip
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("OpenAI-client agent loop on agentcache serve")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
