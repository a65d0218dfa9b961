#!/usr/bin/env python3
"""Append-only tool-use conversations through the stock `openai` client, against two (or three)
`agentcache serve` processes started in one run: the default strategy, `--strategy prefix`
(exact prefix caching) and, unless left out, `--strategy full` (nothing reused).

    HF_HUB_OFFLINE=1 python benchmarks/server/append.py --conversations 4 --steps 6 \
        --out docs/bench/server/append-only

The conversations are bfcl-eval multi_turn_base cases that no workload file of this repository
uses (`taken_cases` reads every workload file for the cases it names, besides the builders'
lists). A step is one request: the system message, the tools, and the case so far, ending with
the user's request or the previous call's result, as `build_workloads.chat_tool_use` builds
them. The conversation grows append-only and is driven by the data: after each step the client
appends the case's recorded call (bfcl's ground truth) and its result from bfcl's own
simulators, not either server's reply, so every server receives the identical message list at
every step whatever the model replied (checked: `agentcache.bench.chat_edits` classifies every
step after the first as an append). Each step goes to every server in one process, the order
alternating per step (even steps default, prefix, full; odd steps full, prefix, default).

Per step and server: the server's prefill time (`X-Agentcache-TTFT-Ms`), the client's request
latency (request sent -> whole reply parsed), prompt tokens, `cached_tokens`, the prompt's
token split (exact / moved / refreshed / computed, from the `agentcache` report), completion
tokens, finish reason and the reply (text and tool calls). Summary: per step after each
conversation's first, default / prefix (prefill time and latency), median with n, IQR and
min-max; replies identical (text and tool calls' names and arguments), empty and cut replies.
Writes results.json (with provenance), report.md and ratios.png.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))  # build_workloads
import build_workloads as bw

ROOT = Path(__file__).resolve().parents[2]
MODEL = "agentcache-default"
TTFT_HEADER = "x-agentcache-ttft-ms"
# the workload files whose bfcl cases are taken (their `source`, or any mention of a case)
WORKLOAD_DIRS = (ROOT / "benchmarks" / "workloads", ROOT / "docs" / "bench" / "workloads")
CASE_NAME = re.compile(r"multi_turn_base_(\d+)\b")
MAX_TOOL_CHARS = 19500  # tool documentation per case (build_chat_edits): prompts stay < 4000
SERVERS = {"default": [], "prefix": ["--strategy", "prefix"], "full": ["--strategy", "full"]}
TARGET = 1.02  # issue 43: default / prefix step latency, median of per-step ratios
WARMUP = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Name a colour."},
]


def taken_cases(dirs: tuple[Path, ...] = WORKLOAD_DIRS) -> set[int]:
    """The bfcl multi_turn_base cases some workload here uses: those the builders list (the
    chat and swe_agent files do not name theirs) and every case named in a workload file."""
    taken = {*bw.SWE_CASES, bw.SWE_DEMO_CASE, *bw.CHAT_TOOL_CASES}
    for d in dirs:
        for path in sorted(d.rglob("*")):
            if path.is_file() and path.suffix in (".jsonl", ".json"):
                text = path.read_text(encoding="utf-8", errors="replace")
                taken |= {int(m) for m in CASE_NAME.findall(text)}
    return taken


def ground_truth(bfcl: Path) -> dict[str, list[list[str]]]:
    """Each multi_turn_base case's ground-truth calls, by case id."""
    path = bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json"
    return {a["id"]: a["ground_truth"] for a in bw.read_jsonl(path)}


def pick_cases(bfcl: Path, n: int, steps: int, taken: set[int]) -> list[int]:
    """The first `n` cases by id that are not taken, have at least `steps` ground-truth calls
    and at most MAX_TOOL_CHARS of tool documentation."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    truth = ground_truth(bfcl)
    doc_chars = {cls: len((bfcl / "multi_turn_func_doc" / f).read_text(encoding="utf-8"))
                 for cls, f in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()}  # fmt: skip
    usable = []
    for case in bw.read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json"):
        cid = int(case["id"].rsplit("_", 1)[1])
        calls = sum(len(c) for c in truth[case["id"]])
        chars = sum(doc_chars[c] for c in case["involved_classes"])
        if cid not in taken and calls >= steps and chars <= MAX_TOOL_CHARS:
            usable.append(cid)
    usable.sort()
    if len(usable) < n:
        sys.exit(f"error: only {len(usable)} unused bfcl cases have {steps} calls or more")
    return usable[:n]


def conversation(bfcl: Path, cid: int, steps: int) -> dict[str, Any]:
    """Case `cid`'s first `steps` requests: before each ground-truth call, the messages so far
    (ending with the user's request or the previous call's result) and the tools."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    from agentcache.workload.edits import classify

    cases = {c["id"]: c for c in bw.read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json")}
    truth = ground_truth(bfcl)
    case = cases[f"multi_turn_base_{cid}"]
    doc_dir = bfcl / "multi_turn_func_doc"
    docs = [d for cls in sorted(case["involved_classes"])
            for d in bw.read_jsonl(doc_dir / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])]  # fmt: skip
    tools = [bw.openai_tool(d) for d in docs]
    params = {d["name"]: list(d["parameters"].get("properties", {})) for d in docs}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": bw.CHAT_TOOL_SYS}]
    requests = []
    replay = bw.replay_case(case, truth[case["id"]])
    for s, (u, call, obs, _) in enumerate(replay[:steps]):
        if s == 0 or replay[s - 1][0] != u:
            msgs.append({"role": "user", "content": case["question"][u][0]["content"]})
        requests.append([dict(m) for m in msgs])
        msgs.append({"role": "assistant", "content": "",
                     "tool_calls": [bw.tool_call(call, s, params)]})  # fmt: skip
        msgs.append({"role": "tool", "tool_call_id": f"call_{s}", "content": obs})
    kinds = [e.kind for e in classify([{"messages": m} for m in requests])]
    if kinds != ["start"] + ["append"] * (len(requests) - 1):
        raise AssertionError(f"case {cid}: steps are not append-only: {kinds}")
    return {"name": f"bfcl-{cid}", "source": f"bfcl multi_turn_base_{cid}", "tools": tools,
            "steps": requests}  # fmt: skip


def order(step: int, labels: list[str]) -> list[str]:
    """The servers' order at a global step: as given on even steps, reversed on odd ones."""
    return list(labels) if step % 2 == 0 else list(reversed(labels))


def reply_of(message: Any) -> dict[str, Any]:
    calls = [{"function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in message.tool_calls or ()]  # fmt: skip
    return {"content": message.content, "tool_calls": calls}


def ask(
    base_url: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One non-streamed request through the stock openai client: the step's record and reply."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1800)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens,  # type: ignore[arg-type]
        **extra,
    )  # fmt: skip
    body = raw.parse()
    latency = time.perf_counter() - t0
    report = (body.model_extra or {})["agentcache"]
    usage = body.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    choice = body.choices[0]
    reply = reply_of(choice.message) | {"finish_reason": choice.finish_reason}
    record = {
        "ttft_ms": float(raw.headers[TTFT_HEADER]),
        "latency_ms": 1e3 * latency,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "finish_reason": choice.finish_reason,
        "reported_strategy": report["strategy"],
        **{f"{k}_tokens": report[f"{k}_tokens"]
           for k in ("exact", "moved", "refreshed", "computed", "recomputed")},
        "segments": [s["status"] for s in report["segments"]],
    }  # fmt: skip
    return record, reply


def reply_key(reply: dict[str, Any]) -> str:
    """A reply as compared: text and tool calls' names and arguments (as figure_query does)."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]]
    return json.dumps([reply.get("content") or "", calls])


def is_empty(reply: dict[str, Any]) -> bool:
    return not (reply.get("content") or "").strip() and not reply["tool_calls"]


def spread(xs: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q25": qs[0], "q75": qs[2], "min": min(xs),
            "max": max(xs), "n": len(xs)}  # fmt: skip


def paired(turns: list[dict[str, Any]], label: str, base: str, field: str) -> list[float]:
    """Per step after each conversation's first: `label`'s field / `base`'s on the same step."""
    theirs = {(r["session"], r["turn"]): r[field] for r in turns if r["strategy"] == base}
    return [r[field] / theirs[(r["session"], r["turn"])] for r in turns
            if r["strategy"] == label and r["turn"] > 0]  # fmt: skip


def compare(replies: dict[str, list[list[dict[str, Any]]]], a: str, b: str) -> dict[str, Any]:
    xs = [r for s in replies[a] for r in s]
    ys = [r for s in replies[b] for r in s]
    both = [(x, y) for x, y in zip(xs, ys, strict=True) if not is_empty(x) and not is_empty(y)]
    return {
        "steps": len(xs),
        "compared": len(both),
        "identical": sum(reply_key(x) == reply_key(y) for x, y in both),
        "empty": len(xs) - len(both),
        "differing": [i for i, (x, y) in enumerate(zip(xs, ys, strict=True))
                      if reply_key(x) != reply_key(y)],
    }  # fmt: skip


def summarize(
    turns: list[dict[str, Any]], replies: dict[str, list[list[dict[str, Any]]]], labels: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in labels:
        if label == "prefix":
            continue
        key = f"{label}_vs_prefix"
        out[key] = {
            "ttft": spread(paired(turns, label, "prefix", "ttft_ms")),
            "latency": spread(paired(turns, label, "prefix", "latency_ms")),
            "other": spread(paired(turns, label, "prefix", "other_ms")),
            "replies": compare(replies, label, "prefix"),
        }
    mine = [r for r in turns if r["strategy"] == "default"]
    out["cut_replies"] = {label: sum(r["finish_reason"] == "length" for r in turns
                                     if r["strategy"] == label) for label in labels}  # fmt: skip
    out["empty_replies"] = {label: sum(is_empty(r) for s in replies[label] for r in s)
                            for label in labels}  # fmt: skip
    warm = [r for r in mine if r["turn"] > 0]
    out["default_warm_cached_share"] = spread([r["cached_tokens"] / r["prompt_tokens"]
                                               for r in warm])  # fmt: skip
    out["target"] = {"ratio": TARGET, "latency_met": out["default_vs_prefix"]["latency"]["median"]
                     <= TARGET}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--steps", type=int, default=6, help="steps (requests) per conversation")
    p.add_argument("--max-tokens", type=int, default=128,
                   help="reply budget (a bfcl call of these cases takes 20-60 tokens)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch threads per server")
    p.add_argument("--no-full", action="store_true", help="leave out the --strategy full server")
    args = p.parse_args(argv)
    if min(args.conversations, args.steps, args.max_tokens, args.threads) < 1:
        p.error("--conversations, --steps, --max-tokens and --threads must be >= 1")
    from tqdm import tqdm

    from agentcache.bench.provenance import load_average, provenance, specs_of
    from agentcache.bench.results import write_run
    from agentcache.testing import ServeProcess

    bfcl = bw.pkg_dir("bfcl_eval", "bfcl-eval") / "data"
    taken = taken_cases()
    cids = pick_cases(bfcl, args.conversations, args.steps, taken)
    convs = [conversation(bfcl, cid, args.steps) for cid in cids]
    labels = [k for k in SERVERS if not (args.no_full and k == "full")]
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "servers.log"
    log.write_text("")
    load_before = load_average()
    t_start = time.perf_counter()
    servers: dict[str, Any] = {}
    turns: list[dict[str, Any]] = []
    replies: dict[str, list[list[dict[str, Any]]]] = {k: [] for k in labels}
    try:
        for label in labels:
            servers[label] = ServeProcess(["--threads", str(args.threads), *SERVERS[label]],
                                          log, MODEL)  # fmt: skip
        reported = {}
        for label in labels:  # one-time costs before the first measured step
            record, _ = ask(servers[label].base_url, WARMUP, [], 8)
            reported[label] = record["reported_strategy"]
        total = sum(len(c["steps"]) for c in convs)
        step = 0
        with tqdm(total=total * len(labels), desc="requests", unit="req") as bar:
            for conv in convs:
                for label in labels:
                    replies[label].append([])
                for t, messages in enumerate(conv["steps"]):
                    for pos, label in enumerate(order(step, labels)):
                        record, reply = ask(servers[label].base_url, messages, conv["tools"],
                                            args.max_tokens)  # fmt: skip
                        record["other_ms"] = record["latency_ms"] - record["ttft_ms"]
                        turns.append({"session": conv["name"], "turn": t, "step": step,
                                      "strategy": label, "position": pos, **record})  # fmt: skip
                        replies[label][-1].append(reply)
                        bar.update()
                        bar.set_postfix_str(f"{conv['name']} step {t} {label}")
                    step += 1
    finally:
        for s in servers.values():
            s.close()
    specs = {label: reported[label] for label in labels}
    origin = provenance(specs_of(specs.values()), None, [c["name"] for c in convs], argv,
                        script="benchmarks/server/append.py")  # fmt: skip
    # the labels of this file are the servers' flags; each resolves to what its server reported
    by_name = origin["specs"]
    origin["specs"] = {label: by_name[reported[label]] for label in labels}
    origin["reported_strategies"] = reported
    conv_rows = [{"name": c["name"], "source": c["source"], "steps": len(c["steps"]),
                  "tools": len(c["tools"])} for c in convs]  # fmt: skip
    config = {
        "max_tokens": args.max_tokens, "threads": args.threads, "steps": args.steps,
        "servers": {k: ["agentcache", "serve", *SERVERS[k]] for k in labels},
        "driven_by": "recorded bfcl calls and simulator results",
        "order": f"even steps {', '.join(order(0, labels))}; "
                 f"odd steps {', '.join(order(1, labels))}",
    }  # fmt: skip
    results = {
        "provenance": origin,
        "config": config,
        "conversations": conv_rows,
        "taken_cases": sorted(taken),
        "load_average": {"before": load_before, "after": load_average()},
        "wall_s": time.perf_counter() - t_start,
        "summary": summarize(turns, replies, labels),
        "turns": turns,
        "replies": replies,
    }
    report = write_run(args.out, results, render)
    plot(turns, labels, args.out / "ratios.png")
    print(report)
    return 0


def render(results: dict[str, Any]) -> str:
    s, prov, cfg = results["summary"], results["provenance"], results["config"]
    labels = list(cfg["servers"])
    lines = [
        "# Append-only tool-use conversations: the default server against `--strategy prefix`",
        "",
        f"Command: `{prov['command']}` (commit {prov['commit']}, {prov['date']}).",
        "",
        f"Conversations: {', '.join(c['source'] for c in results['conversations'])} "
        f"({cfg['steps']} steps each), in no workload file here; driven by the "
        f"{cfg['driven_by']}, so every server got the same messages at every step. Servers "
        "in one run, "
        + ", ".join(f"{k} = `{prov['specs'][k]}`" for k in labels)
        + f"; {cfg['threads']} torch thread(s) each, one request at a time, order {cfg['order']}; "
        f"reply budget {cfg['max_tokens']} tokens, temperature 0. Load average (1/5/15 min) "
        f"before {', '.join(f'{x:.1f}' for x in results['load_average']['before'])}, after "
        f"{', '.join(f'{x:.1f}' for x in results['load_average']['after'])}; wall time "
        f"{results['wall_s']:.0f} s.",
        "",
        "Per step after each conversation's first (the append steps), X / prefix on the same "
        "step: prefill time (`X-Agentcache-TTFT-Ms`), the client's request latency, and the "
        "rest of the latency (latency - prefill: HTTP, segmenting, storing, decoding).",
        "",
        "| server | n | prefill: median (IQR; min-max) | latency: median (IQR; min-max) "
        "| rest: median | replies identical to prefix's (of compared; empty) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for label in labels:
        if label == "prefix":
            continue
        v = s[f"{label}_vs_prefix"]
        t, lat, rest, rep = v["ttft"], v["latency"], v["other"], v["replies"]
        lines.append(
            f"| {label} | {lat['n']} | {t['median']:.3f}x ({t['q25']:.3f}-{t['q75']:.3f}; "
            f"{t['min']:.3f}-{t['max']:.3f}) | {lat['median']:.3f}x ({lat['q25']:.3f}-"
            f"{lat['q75']:.3f}; {lat['min']:.3f}-{lat['max']:.3f}) | {rest['median']:.3f}x | "
            f"{rep['identical']} of {rep['compared']} ({rep['empty']} empty) |"
        )
    d = s["default_vs_prefix"]["latency"]["median"]
    met = "met" if s["target"]["latency_met"] else "missed"
    lines += [
        "",
        f"Target (issue 43): default / prefix step latency <= {s['target']['ratio']}x, median of "
        f"per-step ratios: {d:.3f}x, **{met}**. Replies cut at the budget: "
        + ", ".join(f"{k} {v}" for k, v in s["cut_replies"].items())
        + "; empty: " + ", ".join(f"{k} {v}" for k, v in s["empty_replies"].items()) + ".",
        "",
        "![default / prefix per step](ratios.png)",
        "",
        "| conversation | step | prompt | default: cached / exact / moved / refreshed / computed "
        "| prefix: cached / computed | prefill ms default / prefix | latency ms default / prefix "
        "| completion tokens | same reply |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    rows = {(r["session"], r["turn"], r["strategy"]): r for r in results["turns"]}
    names = [c["name"] for c in results["conversations"]]
    for ci, name in enumerate(names):
        for t in range(cfg["steps"]):
            a, b = rows.get((name, t, "default")), rows.get((name, t, "prefix"))
            if a is None or b is None:
                continue
            same = reply_key(results["replies"]["default"][ci][t]) == reply_key(
                results["replies"]["prefix"][ci][t]
            )
            lines.append(
                f"| {name} | {t} | {a['prompt_tokens']} | {a['cached_tokens']} / "
                f"{a['exact_tokens']} / {a['moved_tokens']} / {a['refreshed_tokens']} / "
                f"{a['computed_tokens']} | {b['cached_tokens']} / {b['computed_tokens']} | "
                f"{a['ttft_ms']:.0f} / {b['ttft_ms']:.0f} | {a['latency_ms']:.0f} / "
                f"{b['latency_ms']:.0f} | {a['completion_tokens']} / {b['completion_tokens']} | "
                f"{'yes' if same else 'no'} |"
            )
    lines += ["", "Every request's record and reply is in results.json."]
    return "\n".join(lines) + "\n"


def plot(turns: list[dict[str, Any]], labels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for label in labels:
        if label == "prefix":
            continue
        steps = [r["step"] for r in turns if r["strategy"] == label and r["turn"] > 0]
        for field, style in (("latency_ms", "o-"), ("ttft_ms", "s--")):
            what = "latency" if field == "latency_ms" else "prefill"
            ax.plot(steps, paired(turns, label, "prefix", field), style,
                    label=f"{label} / prefix, {what}", alpha=0.8)  # fmt: skip
    ax.axhline(TARGET, color="grey", linewidth=0.8, linestyle=":", label=f"target {TARGET}x")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_yscale("log")
    ax.set_xlabel("step (append steps of every conversation, in run order)")
    ax.set_ylabel("ratio to prefix, same step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
