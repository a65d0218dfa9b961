#!/usr/bin/env python3
"""A bounded load test of `agentcache serve`: N agent clients at once for a fixed time, one of
them abandoning a long request every few seconds; every client's greedy replies checked
against its solo run.

    AGENTCACHE_NUM_THREADS=1 python benchmarks/server_load.py --clients 8 --duration 60 \
        --out docs/bench/server/load-8x60

Phases: (1) solo: each client's conversation (`--turns` turns, temperature 0, the conversation
header echoed) alone, in turn;
(2) load: all clients loop over their conversations for `--duration` seconds, odd clients
streaming, client 0 instead sends a long request (`--long-tokens`) every `--abandon-every`
seconds and hangs up after 1 s (alternately streaming and not). The server is started in this
process on a free loopback port (`--model tiny`, a seeded random model, or `default`), or is
the one at `--url` (loopback only). Reported: errors, replies that differ from the solo run,
p50/p99 latency of the agent requests under load against solo, the server's resident memory
over time (in-process only), and the server's own counters. Writes results.json and report.md.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

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


def rss_bytes() -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) * 1024  # type: ignore[union-attr]


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _mallinfo2() -> Callable[[], MallInfo2] | None:
    """glibc's mallinfo2, looked up once (None: not glibc)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2
    return fn


def heap_bytes() -> tuple[int, int, int]:
    """(bytes malloc has handed out, free bytes it holds, Python's allocated blocks): what
    resident memory is made of, so a rise can be told apart from memory kept but unused."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return -1, -1, sys.getallocatedblocks()
    info = mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks, sys.getallocatedblocks()


Parts = Callable[[], dict[str, int]]  # the in-process server's bounded structures, by size


def sample_memory(samples: list[tuple[float, int]], heap: list[tuple[float, int, int, int]],
                  parts: list[dict[str, float]], inspect: Parts | None, t0: float,
                  stop: threading.Event) -> None:  # fmt: skip
    while not stop.wait(2.0):
        t = round(time.monotonic() - t0, 1)
        samples.append((t, rss_bytes()))
        heap.append((t, *heap_bytes()))
        if inspect is not None:
            parts.append({"t": t, **inspect()})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args: argparse.Namespace, url: str, model: str, inspect: Parts | None) -> dict[str, Any]:
    """`inspect`: the sizes of an in-process server's structures (None: a server elsewhere,
    whose memory this process cannot see)."""
    solo = [ClientLog() for _ in range(args.clients)]
    for i in range(1, args.clients):  # client 0 abandons; the others run their script alone
        conversation(url, model, i, args.turns, i % 2 == 1, solo[i])
    load = [ClientLog() for _ in range(args.clients)]
    memory: list[tuple[float, int]] = []
    heap: list[tuple[float, int, int, int]] = []
    parts: list[dict[str, float]] = []
    t0 = time.monotonic()
    stop_at, stop = t0 + args.duration, threading.Event()
    watcher = threading.Thread(
        target=sample_memory, args=(memory, heap, parts, inspect, t0, stop), daemon=True
    )
    if inspect is not None:
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
    result = summarize(args, solo, load, memory, heap, httpx.get(f"{url}/metrics").text)
    return result | {"server_parts": parts}


KEPT = ("requests", "cancel", "store_bytes")  # the server counters a report keeps


def summarize(args: argparse.Namespace, solo: list[ClientLog], load: list[ClientLog],
              memory: list[tuple[float, int]], heap: list[tuple[float, int, int, int]],
              metrics: str) -> dict[str, Any]:  # fmt: skip
    differing = compared = 0
    for alone, loaded in zip(solo[1:], load[1:], strict=True):
        for replies in loaded.replies:
            expected = alone.replies[0][: len(replies)]
            compared += len(replies)
            differing += sum(a != b for a, b in zip(replies, expected, strict=True))
    solo_lat = [x for c in solo for x in c.latencies_s]
    load_lat = [x for c in load for x in c.latencies_s]
    found = re.findall(r"^(agentcache_\S+) (\S+)$", metrics, re.M)
    counters = {k: float(v) for k, v in found if "_created" not in k}
    warm = [(t, b) for t, b in memory if t >= args.duration / 3]
    warm_heap = [h for h in heap if h[0] >= args.duration / 3]
    return {
        "clients": args.clients, "duration_s": args.duration, "turns": args.turns,
        "max_active": args.max_active if not args.url else None,
        "model": args.model if not args.url else args.url,
        "requests": len(load_lat), "errors": [e for c in load for e in c.errors],
        "replies_compared": compared, "replies_differing": differing,
        "abandoned": load[0].abandoned, "long_finished_before_hang_up": load[0].finished_early,
        "latency_s": latencies(solo_lat, load_lat),
        "rss_bytes": memory,
        "rss_after_warmup": [min(b for _, b in warm), max(b for _, b in warm)] if warm else None,
        "rss_slope_mib_per_min": slope_mib_per_min(warm) if len(warm) > 2 else None,
        "heap": heap,  # (s, bytes malloc handed out, free bytes it holds, Python blocks)
        "heap_slope_mib_per_min": {
            "malloc_in_use": slope_mib_per_min([(h[0], h[1]) for h in warm_heap]),
            "malloc_free_held": slope_mib_per_min([(h[0], h[2]) for h in warm_heap]),
        } if len(warm_heap) > 2 and warm_heap[0][1] >= 0 else None,
        "think_s": args.think,
        "server_counters": {k: v for k, v in counters.items() if any(w in k for w in KEPT)},
        "per_client": [asdict(c) | {"replies": len(c.replies)} for c in load],
    }  # fmt: skip


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float:
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
    if result.get("server_parts"):
        last = result["server_parts"][-1]
        lines += ["", "At the end: " + ", ".join(f"{k} {v:g}" for k, v in last.items() if k != "t")
                  + " (every 2 s in results.json)."]  # fmt: skip
    if result.get("heap_slope_mib_per_min"):
        h = result["heap_slope_mib_per_min"]
        lines += ["", f"Of it, over the same span: bytes malloc has handed out "
                  f"{h['malloc_in_use']:+.2f} MiB/min, free bytes malloc holds "
                  f"{h['malloc_free_held']:+.2f} MiB/min."]  # fmt: skip
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
        help="in-process server: the segment store's bound (default 256 MiB)",
    )
    p.add_argument(
        "--conversation-bytes",
        type=int,
        default=64 << 20,
        help="in-process server: what it remembers of conversations (default 64 MiB)",
    )
    p.add_argument(
        "--max-active",
        type=int,
        default=4,
        help="in-process server: requests at the engine at once (1: one after the other)",
    )
    p.add_argument(
        "--trim-interval",
        type=float,
        default=10.0,
        help="in-process server: seconds between returning freed heap memory (0: never)",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
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
        result = run(args, args.url, model, inspect=None)
    else:
        server, inspect = in_process_server(
            args.model, args.store_bytes, args.conversation_bytes, args.max_active,
            args.trim_interval,
        )  # fmt: skip
        with server as url:
            result = run(args, url, "load", inspect)
    command = "AGENTCACHE_NUM_THREADS=1 python benchmarks/server_load.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None
    )
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "report.md").write_text(report(result, command))
    print(report(result, command))


def in_process_server(
    model_name: str, store_bytes: int, conversation_bytes: int, max_active: int,
    trim_interval: float,
) -> tuple[Any, Parts]:  # fmt: skip
    import os

    import torch

    from agentcache.model.loading import load_model
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server import ServerConfig, create_app
    from agentcache.server.inprocess import serve_in_thread
    from agentcache.testing import tiny_model

    torch.set_num_threads(int(os.environ.get("AGENTCACHE_NUM_THREADS", "1")))
    model = tiny_model() if model_name == "tiny" else load_model(model_name)
    engine = Engine(model, EngineConfig(kv_pages=1024, store_bytes=store_bytes))
    config = ServerConfig(
        "load", tracker_bytes=conversation_bytes, max_active=max_active,
        trim_interval_s=trim_interval,
    )  # fmt: skip
    app = create_app(engine, config)
    tracker = app.state.chat.tracker.book
    ledger = engine.store._ledger  # instrumentation: the store's record of evicted keys

    def inspect() -> dict[str, int]:
        return {
            "store_bytes": engine.store.stats.bytes,
            "tracker_bytes": tracker.nbytes, "conversations": len(tracker),
            "evicted_keys_remembered": len(ledger._evicted),
        }  # fmt: skip

    return serve_in_thread(app), inspect


if __name__ == "__main__":
    main()
