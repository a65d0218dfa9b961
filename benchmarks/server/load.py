#!/usr/bin/env python3
"""A bounded load test of `agentcache serve`: N agent clients at once for a fixed time, one of
them abandoning a long request every few seconds; every client's greedy replies checked
against its solo run.

    AGENTCACHE_NUM_THREADS=1 python benchmarks/server/load.py --clients 8 --duration 60 \
        --out docs/bench/server/load-8x60

Phases: (1) solo: each client's conversation (`--turns` turns, temperature 0, the conversation
header echoed) alone, in turn;
(2) load: all clients loop over their conversations for `--duration` seconds, odd clients
streaming, client 0 instead sends a long request (`--long-tokens`) every `--abandon-every`
seconds and hangs up after 1 s (alternately streaming and not). The server is started on a
free loopback port (`--model tiny`, a seeded random model, or `default`) on a thread of this
process (`--server thread`) or in a process of its own (`--server process`: its memory is then
the server's alone), or is the one at `--url` (loopback only). Reported: errors, replies that
differ from the solo run, p50/p99 latency of the agent requests under load against solo, the
server's memory over time (resident, malloc's bytes in use and free, store and conversation
tracker, from its /metrics every 2 s), and its own counters. Writes results.json and report.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from agentcache.bench.results import write_run

SYSTEM = (
    "You are Forge, a software maintenance agent. You solve one task at a time: read before "
    "you edit, run the tests after every change, keep changes minimal, and reply DONE with a "
    "one-line summary when the tests pass."
)
STEPS = ("Open the failing test.", "Read the function it calls.", "Propose a one-line fix.",
         "Run the tests again.", "Summarize the change.")  # fmt: skip
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class ClientLog:
    replies: list[list[str]] = field(default_factory=list)  # per conversation, per turn
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    abandoned: int = 0
    finished_early: int = 0  # long requests that ended (the model stopped) before the hang-up


def conversation(url: str, model: str, task: int, turns: int, stream: bool,
                 log: ClientLog, stop_at: float = float("inf"),
                 think: Callable[[], float] = lambda: 0.0) -> None:  # fmt: skip
    """One agent conversation: the whole history resent each turn, as an OpenAI client does;
    between turns the agent sleeps `think()` seconds (its tools running)."""
    opening = f"Task {task}: the test_parse_{task} test fails."
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opening}]
    replies: list[str] = []
    token: dict[str, str] = {}  # the conversation's token, echoed as a client should
    with httpx.Client(base_url=url, timeout=600) as http:
        for turn in range(turns):
            if turn:
                time.sleep(think())
            if time.monotonic() > stop_at:
                break
            body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0,
                    "stream": stream}  # fmt: skip
            t0 = time.perf_counter()
            try:
                text, token = _post(http, body, stream, token)
            except (httpx.HTTPError, ValueError) as e:
                log.errors.append(f"{type(e).__name__}: {e}"[:300])
                return
            log.latencies_s.append(time.perf_counter() - t0)
            replies.append(text)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": STEPS[turn % len(STEPS)]}]  # fmt: skip
    log.replies.append(replies)


def _post(http: httpx.Client, body: dict[str, Any], stream: bool,
          token: dict[str, str]) -> tuple[str, dict[str, str]]:  # fmt: skip
    """The reply's text, and the header to echo next turn."""
    if not stream:
        r = http.post("/v1/chat/completions", json=body, headers=token)
        if r.status_code != 200:
            raise ValueError(f"status {r.status_code}: {r.text[:200]}")
        return str(r.json()["choices"][0]["message"]["content"]), _echo(r)
    pieces = []
    with http.stream("POST", "/v1/chat/completions", json=body, headers=token) as r:
        if r.status_code != 200:
            raise ValueError(f"status {r.status_code}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise ValueError(f"stream error: {event['error']['message']}")
            for choice in event.get("choices", ()):
                pieces.append(choice["delta"].get("content") or "")
    return "".join(pieces), _echo(r)


def _echo(r: httpx.Response) -> dict[str, str]:
    return {"X-Agentcache-Conversation": r.headers["x-agentcache-conversation"]}


def abandoner(url: str, model: str, args: argparse.Namespace, stop_at: float,
              log: ClientLog) -> None:  # fmt: skip
    """Every `--abandon-every` seconds: a long request, hung up on after `--hang-up-after`."""
    n, every = 0, args.abandon_every
    while time.monotonic() + every < stop_at:
        time.sleep(every)
        story = [{"role": "user", "content": f"Write a long story, number {n}."}]
        body = {"model": model, "max_tokens": args.long_tokens, "temperature": 0,
                "stream": n % 2 == 1, "messages": story}  # fmt: skip
        try:
            with httpx.Client(base_url=url, timeout=args.hang_up_after) as http:
                _post(http, body, bool(body["stream"]), {})
            log.finished_early += 1
        except httpx.TimeoutException:
            log.abandoned += 1
        except (httpx.HTTPError, ValueError) as e:
            log.errors.append(f"abandoner: {type(e).__name__}: {e}"[:300])
        n += 1


MEMORY = {  # /metrics sample -> what a memory sample records
    "agentcache_resident_bytes": "rss", 'agentcache_heap_bytes{kind="in_use"}': "in_use",
    'agentcache_heap_bytes{kind="free_held"}': "free_held",
    'agentcache_store_bytes{tier="memory"}': "store_bytes",
    "agentcache_conversation_bytes": "tracker_bytes", "agentcache_conversations": "conversations",
}  # fmt: skip


def scrape_memory(url: str) -> dict[str, float]:
    """The server's memory as its /metrics tells it (resident, malloc's in use and free held,
    the store's and the conversation tracker's bytes)."""
    found = metric_values(httpx.get(f"{url}/metrics", timeout=30).text)
    return {name: found[k] for k, name in MEMORY.items() if k in found}


def metric_values(text: str) -> dict[str, float]:
    """The agentcache samples of a /metrics page, by name with labels."""
    return {k: float(v) for k, v in re.findall(r"^(agentcache_\S+) (\S+)$", text, re.M)}


def sample_memory(url: str, samples: list[dict[str, float]], t0: float,
                  stop: threading.Event) -> None:  # fmt: skip
    while not stop.wait(2.0):
        # a scrape that times out under load is a missing sample, not an error
        with contextlib.suppress(httpx.HTTPError):
            samples.append({"t": round(time.monotonic() - t0, 1), **scrape_memory(url)})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args: argparse.Namespace, url: str, model: str) -> dict[str, Any]:
    solo = [ClientLog() for _ in range(args.clients)]
    for i in range(1, args.clients):  # client 0 abandons; the others run their script alone
        conversation(url, model, i, args.turns, i % 2 == 1, solo[i])
    load = [ClientLog() for _ in range(args.clients)]
    memory: list[dict[str, float]] = []
    t0 = time.monotonic()
    stop_at, stop = t0 + args.duration, threading.Event()
    watcher = threading.Thread(target=sample_memory, args=(url, memory, t0, stop), daemon=True)
    watcher.start()

    def loop(i: int) -> None:
        rng = random.Random(i)  # each agent's tools take 0.5-1.5x --think seconds
        think = lambda: args.think * rng.uniform(0.5, 1.5)  # noqa: E731
        while time.monotonic() < stop_at:
            conversation(url, model, i, args.turns, i % 2 == 1, load[i], stop_at, think)

    threads = [threading.Thread(target=abandoner, args=(url, model, args, stop_at, load[0]))]
    threads += [threading.Thread(target=loop, args=(i,)) for i in range(1, args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    return summarize(args, solo, load, memory, httpx.get(f"{url}/metrics").text)


KEPT = ("requests", "cancel", "store_bytes")  # the server counters a report keeps


def summarize(args: argparse.Namespace, solo: list[ClientLog], load: list[ClientLog],
              memory: list[dict[str, float]], metrics: str) -> dict[str, Any]:  # fmt: skip
    differing = compared = 0
    for alone, loaded in zip(solo[1:], load[1:], strict=True):
        for replies in loaded.replies:
            expected = alone.replies[0][: len(replies)]
            compared += len(replies)
            differing += sum(a != b for a, b in zip(replies, expected, strict=True))
    solo_lat = [x for c in solo for x in c.latencies_s]
    load_lat = [x for c in load for x in c.latencies_s]
    counters = {k: v for k, v in metric_values(metrics).items() if "_created" not in k}
    return {
        "clients": args.clients, "duration_s": args.duration, "turns": args.turns,
        "max_active": args.max_active if not args.url else None,
        "batch_decode": args.batch_decode if not args.url else None,
        "model": args.model if not args.url else args.url,
        "requests": len(load_lat), "errors": [e for c in load for e in c.errors],
        "replies_compared": compared, "replies_differing": differing,
        "abandoned": load[0].abandoned, "long_finished_before_hang_up": load[0].finished_early,
        "latency_s": latencies(solo_lat, load_lat),
        "server": args.server if not args.url else "url",
        "malloc_arenas": args.malloc_arenas if not args.url else None,
        "store_bytes_bound": args.store_bytes,  # as given: memory_summary judges "full" by them
        "conversation_bytes_bound": args.conversation_bytes,
        "memory": memory,  # every 2 s, from the server's /metrics
        **memory_summary(memory, args.duration, args.store_bytes, args.conversation_bytes),
        "think_s": args.think,
        "server_counters": {k: v for k, v in counters.items() if any(w in k for w in KEPT)},
        "per_client": [asdict(c) | {"replies": len(c.replies)} for c in load],
    }  # fmt: skip


FULL_STORE, FULL_TRACKER = 0.95, 0.99  # shares of their bounds at which they count as full
MIN_FULL_S = 60.0  # the least time after they fill that a run must cover to judge flatness


def memory_summary(memory: list[dict[str, float]], duration: float, store_bytes: int,
                   conversation_bytes: int) -> dict[str, Any]:  # fmt: skip
    """Resident memory after the first third of the run, and after the store and the
    conversation tracker first reach their bounds: ranges and least-squares slopes."""
    warm = [m for m in memory if m["t"] >= duration / 3 and "rss" in m]

    def slope(rows: list[dict[str, float]], key: str) -> float | None:
        points = [(m["t"], m[key]) for m in rows if key in m]
        return slope_mib_per_min(points) if len(points) > 2 else None

    full_from = next(
        (m["t"] for m in memory
         if m.get("store_bytes", 0) >= FULL_STORE * store_bytes
         and m.get("tracker_bytes", 0) >= FULL_TRACKER * conversation_bytes),
        None,
    )  # fmt: skip
    full = [m for m in memory if full_from is not None and m["t"] >= full_from and "rss" in m]
    judged = bool(full) and full[-1]["t"] - full[0]["t"] >= MIN_FULL_S
    rss = [m["rss"] for m in warm]
    return {
        "rss_after_warmup": [min(rss), max(rss)] if rss else None,
        "rss_slope_mib_per_min": slope(warm, "rss"),
        "heap_slope_mib_per_min": {
            "malloc_in_use": slope(warm, "in_use"), "malloc_free_held": slope(warm, "free_held"),
            "tracker": slope(warm, "tracker_bytes"),
        },
        "bounds_full_from_s": full_from,
        "after_bounds_full": {
            "seconds": full[-1]["t"] - full[0]["t"], "samples": len(full),
            "rss": [min(m["rss"] for m in full), max(m["rss"] for m in full)],
            "rss_slope_mib_per_min": slope(full, "rss"),
            "malloc_in_use_slope_mib_per_min": slope(full, "in_use"),
            "malloc_free_held_slope_mib_per_min": slope(full, "free_held"),
        } if judged else None,
    }  # fmt: skip


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of resident memory over time."""
    ts, bs = [t for t, _ in samples], [b / 2**20 for _, b in samples]
    mt, mb = statistics.fmean(ts), statistics.fmean(bs)
    var = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (b - mb) for t, b in zip(ts, bs, strict=True)) / var


def latencies(solo: list[float], load: list[float]) -> dict[str, float]:
    return {
        "solo_p50": statistics.median(solo), "solo_p99": percentile(solo, 0.99),
        "load_p50": statistics.median(load), "load_p99": percentile(load, 0.99),
        "solo_n": len(solo), "load_n": len(load),
    }  # fmt: skip


def report(result: dict[str, Any], command: str) -> str:
    lat = result["latency_s"]
    active = result.get("max_active", 1)  # runs before --max-active had one request at a time
    if active is None:
        at_once = "a server started elsewhere"
    elif active == 1:
        at_once = (
            "under load a request waits for the ones before it: the engine serves one at a time"
        )
    elif result.get("batch_decode"):
        at_once = (f"the engine runs up to {active} requests, their decode steps as one batch "
                   "and waiting prefills in bursts between steps, as `agentcache serve` does; "
                   "the rest wait")  # fmt: skip
    else:
        at_once = f"the engine interleaves up to {active} requests token by token, the rest wait"
    lines = [
        "# Server under load", "", f"Command: `{command}`", "",
        "| clients | duration | agent requests | errors | replies differing from solo | "
        "long requests abandoned |", "|---|---|---|---|---|---|",
        f"| {result['clients']} | {result['duration_s']} s | {result['requests']} | "
        f"{len(result['errors'])} | {result['replies_differing']} of "
        f"{result['replies_compared']} | {result['abandoned']} (and "
        f"{result['long_finished_before_hang_up']} that ended first) |", "",
        "| agent request latency | solo | under load | ratio |", "|---|---|---|---|",
        f"| p50 | {lat['solo_p50']:.3f} s | {lat['load_p50']:.3f} s | "
        f"{lat['load_p50'] / lat['solo_p50']:.1f}x |",
        f"| p99 | {lat['solo_p99']:.3f} s | {lat['load_p99']:.3f} s | "
        f"{lat['load_p99'] / lat['solo_p99']:.1f}x |", "",
        f"(n = {lat['solo_n']} solo, {lat['load_n']} under load; agents think "
        f"{result['think_s']:g} s x U(0.5, 1.5) between turns; {at_once}.)",
    ]  # fmt: skip
    if result["rss_after_warmup"]:
        lo, hi = result["rss_after_warmup"]
        lines += ["", f"Resident memory after the first third: {lo / 2**20:.0f}-"
                  f"{hi / 2**20:.0f} MiB, least-squares slope "
                  f"{result['rss_slope_mib_per_min']:+.2f} MiB/min (samples every 2 s in "
                  "results.json)."]  # fmt: skip
    if result.get("memory"):
        last = result["memory"][-1]
        lines += ["", "At the end: " + ", ".join(f"{k} {v:g}" for k, v in last.items() if k != "t")
                  + " (every 2 s in results.json)."]  # fmt: skip
    h = result.get("heap_slope_mib_per_min") or {}
    if h.get("malloc_in_use") is not None and h.get("malloc_free_held") is not None:
        lines += ["", f"Of it, over the same span: bytes malloc has handed out "
                  f"{h['malloc_in_use']:+.2f} MiB/min, free bytes malloc holds "
                  f"{h['malloc_free_held']:+.2f} MiB/min."]  # fmt: skip
    full = result.get("after_bounds_full")
    if full:
        lo, hi = full["rss"]
        lines += ["", f"Once the store and the conversation tracker were full (from "
                  f"{result['bounds_full_from_s']:g} s, {full['seconds']:.0f} s of samples): "
                  f"resident memory {lo / 2**20:.0f}-{hi / 2**20:.0f} MiB, slope "
                  f"{full['rss_slope_mib_per_min']:+.2f} MiB/min."]  # fmt: skip
        if full.get("malloc_in_use_slope_mib_per_min") is not None:
            lines[-1] += (f" Malloc's bytes in use {full['malloc_in_use_slope_mib_per_min']:+.2f}"
                          f" MiB/min, free held {full['malloc_free_held_slope_mib_per_min']:+.2f}"
                          " MiB/min.")  # fmt: skip
    lines += ["", "Server counters:", ""]
    lines += [f"- `{k}` {v:g}" for k, v in result["server_counters"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation")
    p.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="seconds an agent's tools take between its turns (x U(0.5, 1.5)); 0: none",
    )
    p.add_argument("--abandon-every", type=float, default=5.0)
    p.add_argument("--long-tokens", type=int, default=2000)
    p.add_argument("--hang-up-after", type=float, default=1.0, help="seconds")
    p.add_argument("--model", default="tiny", help="tiny (seeded random) or default")
    p.add_argument("--url", default=None, help="a running server on a loopback address")
    p.add_argument("--served-model-name", default=None)
    p.add_argument(
        "--store-bytes",
        type=int,
        default=256 << 20,
        help="the server's segment store bound (default 256 MiB; with --url, the running "
        "server's, which tells when its store is full)",
    )
    p.add_argument(
        "--conversation-bytes",
        type=int,
        default=64 << 20,
        help="what the server remembers of conversations (default 64 MiB; with --url, the "
        "running server's --conversation-bytes)",
    )
    p.add_argument(
        "--max-active",
        type=int,
        default=4,
        help="in-process server: requests at the engine at once (1: one after the other)",
    )
    p.add_argument(
        "--batch-decode",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="in-process server: the engine as `agentcache serve` runs it, the active "
        "requests' decode steps batched, prefills in bursts between them (default: off, each "
        "request steps alone, interleaved, as the runs before batching)",
    )
    p.add_argument(
        "--trim-interval",
        type=float,
        default=10.0,
        help="in-process server: seconds between returning freed heap memory (0: never)",
    )
    p.add_argument(
        "--server",
        choices=("thread", "process"),
        default="thread",
        help="where the server runs without --url: a thread of this process (its memory then "
        "includes the clients') or a process of its own",
    )
    p.add_argument(
        "--malloc-arenas",
        type=int,
        default=0,
        help="the server's malloc arenas, as serve --malloc-arenas (0: glibc's default)",
    )
    p.add_argument("--out", type=Path, required=False)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rerender", type=Path, default=None, metavar="DIR",
                   help="recompute a run's memory summary and report.md from its results.json "
                   "(give the run's --store-bytes and --conversation-bytes)")  # fmt: skip
    args = p.parse_args()
    if args.rerender is not None:
        rerender(args.rerender, args.store_bytes, args.conversation_bytes)
        return
    if args.child:  # the server of --server process: print its URL, serve until stdin closes
        server = in_process_server(args)
        with server as url:
            print(url, flush=True)
            sys.stdin.read()
        return
    if args.out is None:
        p.error("--out is required")
    if args.think < 0:
        p.error("--think must be >= 0")
    if args.max_active < 1:
        p.error("--max-active must be >= 1")
    if args.clients < 2:
        p.error("--clients must be >= 2 (client 0 abandons, the others converse)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.url:
        if urlparse(args.url).hostname not in LOOPBACK:
            p.error("--url must be a loopback address: this test floods the server it targets")
        model = args.served_model_name or httpx.get(f"{args.url}/v1/models").json()["data"][0]["id"]
        result = run(args, args.url, model)
    else:
        with in_process_server(args) if args.server == "thread" else server_process(args) as url:
            result = run(args, url, "load")
    shown = {k: v for k, v in vars(args).items() if v is not None and k != "child"}
    command = "AGENTCACHE_NUM_THREADS=1 python benchmarks/server/load.py " + " ".join(
        (f"--{'' if v else 'no-'}{k.replace('_', '-')}" if isinstance(v, bool)
         else f"--{k.replace('_', '-')} {v}") for k, v in shown.items()
    )  # fmt: skip
    print(write_run(args.out, result, lambda r: report(r, command)))


def rerender(folder: Path, store_bytes: int, conversation_bytes: int) -> None:
    results = json.loads((folder / "results.json").read_text())
    results |= {"store_bytes_bound": store_bytes, "conversation_bytes_bound": conversation_bytes}
    results |= memory_summary(results["memory"], results["duration_s"], store_bytes,
                              conversation_bytes)  # fmt: skip
    old = (folder / "report.md").read_text()
    command = re.search(r"^Command: `(.*)`$", old, re.M).group(1)  # type: ignore[union-attr]
    write_run(folder, results, lambda r: report(r, command))


@contextlib.contextmanager
def server_process(args: argparse.Namespace) -> Iterator[str]:
    """This script's server (--child) in a process of its own; yields its URL."""
    argv = [sys.executable, __file__, "--child", "--model", args.model,
            "--store-bytes", str(args.store_bytes), "--conversation-bytes",
            str(args.conversation_bytes), "--max-active", str(args.max_active),
            "--batch-decode" if args.batch_decode else "--no-batch-decode",
            "--trim-interval", str(args.trim_interval),
            "--malloc-arenas", str(args.malloc_arenas)]  # fmt: skip
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        url = child.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError(f"the server process did not start (exit {child.poll()})")
        yield url
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()


def in_process_server(args: argparse.Namespace) -> Any:
    """The server on a thread of this process (a context manager yielding its URL)."""
    import os

    import torch

    from agentcache.model.loading import load_model
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server import ServerConfig, create_app
    from agentcache.server.heap import limit_arenas
    from agentcache.server.inprocess import serve_in_thread
    from agentcache.testing import tiny_model

    if args.malloc_arenas:
        limit_arenas(args.malloc_arenas)  # as serve does, before any worker thread starts
    torch.set_num_threads(int(os.environ.get("AGENTCACHE_NUM_THREADS", "1")))
    model = tiny_model() if args.model == "tiny" else load_model(args.model)
    engine = Engine(model, EngineConfig(kv_pages=1024, store_bytes=args.store_bytes,
                                        batch_decode=args.batch_decode))  # fmt: skip
    config = ServerConfig(
        "load", tracker_bytes=args.conversation_bytes, max_active=args.max_active,
        trim_interval_s=args.trim_interval,
    )  # fmt: skip
    return serve_in_thread(create_app(engine, config))


if __name__ == "__main__":
    main()
