"""Long prompts (4k and 8k tokens, most of it a tools block as the server renders it, behind a
system prompt that starts with a time stamp): every strategy against `full`, per request.

Cases, per prompt size (the tools: bfcl-eval's multi_turn_func_doc specs, rendered by
`agentcache.chat.tools.render_tools` as the server renders them):

    no-reuse       a new time stamp and a new question each request: nothing reusable
                   (prefix reuse may find the first block, up to the stamp's minute)
    system         the system prompt seen before, the tools block another one
    system+tools   system prompt and tools block seen before, a new conversation
    history        a conversation continued, same stamp: everything before the new messages
                   was seen (an append-only turn)
    history-stamp  a conversation continued, each request with a new stamp (a new minute,
                   as many agents' system prompts): the history is reusable only shifted
                   behind a changed context

Each request runs on every strategy, one engine (and store) each, the strategies' order
rotated per request, so drift on a shared machine hits all alike; a case's setup requests
(which fill the stores) are recorded as `setup`. Two paths: `engine` (the server's segmenter,
then `Engine.generate`) and `server` (`ChatEngine.complete` in-process, as the server runs a
request). TTFT is the engine's prefill time (`TurnStats.ttft_s`, `X-Agentcache-TTFT-Ms`).

    PYTHONPATH=.:templates:adapters HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/reuse/long_prompts.py --sizes 4000:2,8000:1 --threads 2 \\
        --out docs/bench/long-prompts
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcache.bench.provenance import load_average, provenance, specs_of
from agentcache.bench.results import write_run
from agentcache.chat.messages import ChatMessage, ToolCall, ToolSpec
from agentcache.chat.runner import ChatEngine
from agentcache.chat.segmenter import ConversationTracker
from agentcache.chat.tools import render_tools
from agentcache.model.loading import LoadedModel, load_model
from agentcache.reuse.spec import StrategySpec
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams, TurnStats

CASES = ("no-reuse", "system+tools", "history", "system", "history-stamp")
STRATEGIES = "full,prefix,promptcache,pic,epic,cacheblend,cacheslide,rpdc"
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
ONE = GenerationParams(max_new_tokens=1)
QUESTIONS = [
    "Book a flight from SFO to JFK for next Monday, two passengers, economy.",
    "How much of my travel budget is left after the last booking?",
    "List the files in my home folder and show the largest one.",
    "Send a message to Alice saying the meeting moved to 3pm.",
    "What is the current price of the stock I bought last week?",
    "Open a ticket: the vehicle's left rear tire pressure is low.",
    "Compute the mean of 3, 14, 15 and 92, then post the result.",
    "Cancel my hotel reservation in Paris and refund the card on file.",
]


@dataclass(frozen=True)
class Request:
    size: int
    case: str  # a case name, or "setup"
    index: int
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    serves: tuple[str, ...] = ()  # a setup request: the cases it fills the stores for

    def wanted(self, cases: list[str]) -> bool:
        return self.case in cases or bool(set(self.serves) & set(cases))


def bfcl_tools() -> list[ToolSpec]:
    """Every multi-turn tool spec of bfcl-eval, as OpenAI tools (bfcl says dict/float/tuple)."""
    spec = importlib.util.find_spec("bfcl_eval")
    assert spec is not None and spec.submodule_search_locations, "bfcl-eval is not installed"
    folder = Path(spec.submodule_search_locations[0]) / "data" / "multi_turn_func_doc"
    tools = []
    for f in sorted(folder.glob("*.json")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            desc = d["description"].split("Tool description: ")[-1].strip()
            fn = {"name": d["name"], "description": desc, "parameters": _schema(d["parameters"])}
            tools.append(ToolSpec.from_openai({"type": "function", "function": fn}))
    return tools


def _schema(d: Any) -> Any:
    if isinstance(d, list):
        return [_schema(x) for x in d]
    if not isinstance(d, dict):
        return d
    out = {k: _schema(v) for k, v in d.items() if k != "properties"}
    if "type" in d:
        out["type"] = BFCL_TYPES.get(d["type"], d["type"])
    if "properties" in d:
        out["properties"] = {k: _schema(v) for k, v in d["properties"].items()}
    return out


def tools_of(model: LoadedModel, tools: list[ToolSpec], first: int, tokens: int) -> list[ToolSpec]:
    """Tools from index `first` on (wrapping) until the rendered block has `tokens` tokens."""
    out: list[ToolSpec] = []
    for i in range(len(tools)):
        out.append(tools[(first + i) % len(tools)])
        if len(model.tokenizer.encode(render_tools(out))) >= tokens:
            break
    return out


def system(stamp: int) -> ChatMessage:
    t = datetime.datetime(2026, 12, 3, 9, 0) + datetime.timedelta(minutes=stamp)
    return ChatMessage(
        "system",
        f"Current time: {t:%Y-%m-%d %H:%M}. You are a careful assistant: call a tool whenever "
        "one can answer, never guess ids or file names, and keep replies short.",
    )


def step(j: int) -> list[ChatMessage]:
    """One tool round of a conversation: the call, its result, the user's next question."""
    call = ToolCall(f"call_{j}", "get_state", {"item": j})
    result = json.dumps({"item": j, "status": "ok", "values": list(range(j, j + 40))})
    return [
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", result, (), f"call_{j}"),
        ChatMessage("user", QUESTIONS[(j + 3) % len(QUESTIONS)]),
    ]


def requests(size: int, n: int, model: LoadedModel, tools: list[ToolSpec]) -> Iterator[Request]:
    """The cases' requests at prompt size `size`, `n` measured per case."""
    block = tools_of(model, tools, 0, int(size * 0.9))
    stamp = size  # stamps never repeat across sizes

    def req(
        case: str, i: int, msgs: list[ChatMessage], tl: list[ToolSpec], serves: tuple[str, ...] = ()
    ) -> Request:
        return Request(size, case, i, tuple(msgs), tuple(tl), serves)

    for i in range(n):
        q = ChatMessage("user", QUESTIONS[i % len(QUESTIONS)])
        yield req("no-reuse", i, [system(stamp + 1 + i), q], block)
    stamp += n + 1
    first = [system(stamp), ChatMessage("user", QUESTIONS[0])]
    yield req("setup", 0, first, block, ("system+tools", "system", "history"))
    for i in range(n):
        yield req("system+tools", i, [system(stamp), ChatMessage("user", QUESTIONS[i + 2])], block)
    msgs = first[1:]
    for i in range(n):  # the setup's conversation continued
        msgs += step(i)
        yield req("history", i, [system(stamp), *msgs], block)
    for i in range(n):  # the same system prompt, another tools block each time
        other = tools_of(model, tools, 7 * (i + 1), int(size * 0.9))
        yield req("system", i, [system(stamp), ChatMessage("user", QUESTIONS[i + 1])], other)
    stamp += 1
    msgs = [ChatMessage("user", QUESTIONS[5])]
    yield req("setup", 1, [system(stamp), *msgs], block, ("history-stamp",))
    for i in range(n):  # continued, each request with a new stamp
        msgs += step(i)
        yield req("history-stamp", i, [system(stamp + i + 1), *msgs], block)


def run_request(path: str, engine: Engine, tracker: ConversationTracker, r: Request) -> TurnStats:
    if path == "server":
        return ChatEngine(engine, tracker).complete(r.messages, ONE, r.tools).generation.stats
    chat = tracker.segment(r.messages, r.tools)
    gen = engine.generate(engine.tokenize(chat.prompt), ONE)
    tracker.record(chat, None)
    return gen.stats


def row(path: str, label: str, r: Request, s: TurnStats, wall_s: float) -> dict[str, Any]:
    return {
        "size": r.size, "case": r.case, "request": r.index, "path": path, "strategy": label,
        "prompt_tokens": s.prompt_tokens, "ttft_ms": s.ttft_s * 1e3, "wall_ms": wall_s * 1e3,
        "reused_tokens": s.reused_tokens, "loaded_tokens": s.loaded_tokens,
        "recomputed_tokens": s.recomputed_tokens, "model_calls": s.model_calls,
        "exact": s.exact_plan, "guarded": s.guarded, "plan_cost": s.plan_cost,
        "full_cost": s.full_cost, "probe_skipped": s.probe_skipped, "fallbacks": s.fallbacks,
    }  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (size, case, path, strategy): TTFT / full's and / prefix's on the same request,
    median with n and range."""
    key = ("size", "case", "path", "request")
    by_req: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_req.setdefault(tuple(r[k] for k in key), {})[r["strategy"]] = r
    groups: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for (size, case, path, _), per in by_req.items():
        if case == "setup":
            continue
        full, prefix = per.get("full"), per.get("prefix")
        for label, r in per.items():
            g = groups.setdefault((size, case, path, label), {"full": [], "prefix": [], "ms": []})
            g["ms"].append(r["ttft_ms"])
            if full is not None:
                g["full"].append(r["ttft_ms"] / full["ttft_ms"])
            if prefix is not None and prefix["reused_tokens"] > 0:
                g["prefix"].append(r["ttft_ms"] / prefix["ttft_ms"])
    return [
        {"size": k[0], "case": k[1], "path": k[2], "strategy": k[3], "n": len(g["ms"]),
         "ttft_ms_median": statistics.median(g["ms"])}
        | _stat("vs_full", g["full"]) | _stat("vs_prefix", g["prefix"])
        for k, g in groups.items()
    ]  # fmt: skip


def _stat(name: str, xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {f"{name}_median": None, f"{name}_min": None, f"{name}_max": None}
    return {
        f"{name}_median": statistics.median(xs), f"{name}_min": min(xs), f"{name}_max": max(xs)
    }  # fmt: skip


def report(results: dict[str, Any]) -> str:
    lines = [
        "# Long prompts: every strategy against `full` and `prefix`",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit {results['commit']}, {results['date']}, {results['machine']}"
        + (
            f", load average {results['load_average']} (1, 5, 15 min) when written."
            if "load_average" in results
            else "."
        ),
        "",
        "TTFT / `full`'s (and / `prefix`'s, on requests where `prefix` reused tokens) on the same "
        "request: median [min-max] over n requests.",
        "",
        "| size | case | path | strategy | n | TTFT ms (median) | / full | / prefix |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in results["summary"]:
        lines.append(
            f"| {s['size']} | {s['case']} | {s['path']} | {s['strategy']} | {s['n']} "
            f"| {s['ttft_ms_median']:.0f} | {_fmt(s, 'vs_full')} | {_fmt(s, 'vs_prefix')} |"
        )
    lines += [
        "",
        "The work each request did (counted, not timed):",
        "",
        "| size | case | # | path | strategy | tokens | TTFT ms | model calls | loaded | computed "
        "| exact | guarded | plan / full cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        cost = "-" if r["plan_cost"] is None else f"{r['plan_cost'] / r['full_cost']:.3f}"
        lines.append(
            f"| {r['size']} | {r['case']} | {r['request']} | {r['path']} | {r['strategy']} "
            f"| {r['prompt_tokens']} | {r['ttft_ms']:.0f} | {r['model_calls']} "
            f"| {r['loaded_tokens']} | {r['recomputed_tokens']} | {r['exact']} | {r['guarded']} "
            f"| {cost} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(s: dict[str, Any], name: str) -> str:
    if s[f"{name}_median"] is None:
        return "-"
    return f"{s[f'{name}_median']:.3f} [{s[f'{name}_min']:.3f}-{s[f'{name}_max']:.3f}]"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4000:2,8000:1", help="size:requests per case, ...")
    p.add_argument("--strategies", default=STRATEGIES, help="engine path (full first)")
    p.add_argument("--server-strategies", default="full,prefix,rpdc", help='"": no server path')
    p.add_argument("--cases", default=",".join(CASES), help="of " + ",".join(CASES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--render", action="store_true", help="rewrite OUT/report.md from its results")
    a = p.parse_args(argv)
    if a.render:
        results = json.loads((a.out / "results.json").read_text())
        (a.out / "report.md").write_text(report(results))
        return
    torch.set_num_threads(a.threads)
    cases = a.cases.split(",")
    if unknown := set(cases) - set(CASES):
        p.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    sizes = [(int(s), int(n)) for s, n in (x.split(":") for x in a.sizes.split(","))]
    paths = {"engine": a.strategies.split(","), "server": a.server_strategies.split(",")}
    paths = {path: labels for path, labels in paths.items() if labels != [""]}  # "": no path
    model = load_model()
    tools = bfcl_tools()
    engines = {
        (path, label): (Engine(model, EngineConfig(strategy=label, kv_pages=1024)),
                        ConversationTracker())
        for path, labels in paths.items() for label in labels
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    a.out.mkdir(parents=True, exist_ok=True)
    count = 0
    for size, n in sizes:
        for r in requests(size, n, model, tools):
            if not r.wanted(cases):
                continue
            for path, labels in paths.items():
                k = count % len(labels)
                for label in labels[k:] + labels[:k]:  # rotated per request
                    engine, tracker = engines[(path, label)]
                    t0 = time.perf_counter()
                    stats = run_request(path, engine, tracker, r)
                    rows.append(row(path, label, r, stats, time.perf_counter() - t0))
                    x = rows[-1]
                    print(
                        f"{size} {r.case}#{r.index} {path} {label}: {x['prompt_tokens']} tok, "
                        f"{x['ttft_ms']:.0f} ms, reused {x['reused_tokens']}, loaded "
                        f"{x['loaded_tokens']}, computed {x['recomputed_tokens']}, guarded "
                        f"{x['guarded']}",
                        file=sys.stderr,
                        flush=True,
                    )
            count += 1
            write(a, rows)  # after every request: a run cut short keeps what it measured


def write(a: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    specs = specs_of(r["strategy"] for r in rows)
    command = " ".join(["python", *sys.argv])
    write_results(a.out, "benchmarks/reuse/long_prompts.py", specs, rows, summarize(rows), report,
                  command)  # fmt: skip


def write_results(
    out: Path, script: str, specs: list[StrategySpec], rows: list[dict[str, Any]], summary: Any,
    report: Callable[[dict[str, Any]], str], command: str | None = None,
) -> None:  # fmt: skip
    """`out`/results.json (provenance, command, commit, date, machine, summary, rows) and
    `out`/report.md (`report` of those results). `command`: the one recorded beside the
    provenance's (`python <script> <args>`), which it is when None."""
    prov = provenance(specs, script=script)
    results = {
        "provenance": prov,
        "load_average": load_average(),
        "command": prov["command"] if command is None else command,
        "commit": prov["commit"],
        "date": prov["date"],
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, cores {os.cpu_count()}",
        "summary": summary,
        "rows": rows,
    }
    write_run(out, results, report)


if __name__ == "__main__":
    main()
