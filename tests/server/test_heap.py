"""The server hands freed heap memory back on a timer (server/heap.py)."""

from __future__ import annotations

import threading

import pytest
from starlette.testclient import TestClient

from agentcache.cli import build_parser
from agentcache.server import ServerConfig, create_app, heap
from agentcache.server.cli import server_config
from agentcache.server.heap import HeapTrimmer
from tests.server.test_serving_engine import ScriptedEngine


class CountingTrim:
    def __init__(self, calls_wanted: int) -> None:
        self.pads: list[int] = []
        self.enough = threading.Event()
        self.calls_wanted = calls_wanted

    def __call__(self, pad: int) -> int:
        self.pads.append(pad)
        if len(self.pads) >= self.calls_wanted:
            self.enough.set()
        return 1


def test_the_trimmer_calls_malloc_trim_on_its_timer_until_stopped() -> None:
    trim = CountingTrim(3)
    trimmer = HeapTrimmer(0.01, trim)
    trimmer.start()
    assert trim.enough.wait(5.0)
    trimmer.stop()
    calls = len(trim.pads)
    assert trim.pads == [0] * calls  # pad 0: every free page back
    assert trimmer.trims == calls and trimmer.seconds >= 0.0
    threading.Event().wait(0.05)
    assert len(trim.pads) == calls  # stopped means stopped


def test_the_real_trim_runs_on_glibc() -> None:
    trimmer = HeapTrimmer(60.0)
    if not trimmer.available:
        pytest.skip("not glibc: the trimmer does nothing")
    trimmer.trim_now()
    assert trimmer.trims == 1


def test_without_malloc_trim_the_trimmer_starts_no_thread() -> None:
    trimmer = HeapTrimmer(0.01)
    trimmer._trim = None  # as on a system without glibc
    trimmer.start()
    assert trimmer._thread is None and trimmer.trims == 0
    trimmer.stop()


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_the_trimmer_needs_a_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        HeapTrimmer(interval)


def test_the_app_runs_its_trimmer_while_it_serves() -> None:
    app = create_app(ScriptedEngine(), ServerConfig("scripted", trim_interval_s=30.0))
    trimmer = app.state.trimmer
    with TestClient(app):
        assert trimmer._thread is not None and trimmer._thread.is_alive()
    assert trimmer._thread is None  # stopped with the app
    off = create_app(ScriptedEngine(), ServerConfig("scripted", trim_interval_s=0.0))
    assert off.state.trimmer is None


def test_trim_interval_comes_from_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    assert server_config(parse(["serve"]), "m").trim_interval_s == 10.0
    assert server_config(parse(["serve", "--trim-interval", "0"]), "m").trim_interval_s == 0.0
    with pytest.raises(SystemExit):
        parse(["serve", "--trim-interval", "-1"])
    assert "--trim-interval" in capsys.readouterr().err
    with pytest.raises(ValueError, match="trim_interval_s"):
        ServerConfig("m", trim_interval_s=-1.0)


def test_limit_arenas_needs_at_least_one() -> None:
    with pytest.raises(ValueError, match="n must be >= 1"):
        heap.limit_arenas(0)


def test_limit_arenas_calls_mallopt_with_m_arena_max(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(heap, "_libc", lambda: Libc())
    assert heap.limit_arenas(2) is True
    assert calls == [(-8, 2)]  # M_ARENA_MAX in glibc's malloc.h
    monkeypatch.setattr(heap, "_libc", lambda: None)  # not glibc
    assert heap.limit_arenas(2) is False


def test_heap_usage_and_resident_bytes_report_this_process() -> None:
    rss = heap.resident_bytes()
    usage = heap.heap_usage()
    if rss is None or usage is None:
        pytest.skip("not Linux with glibc: nothing to report")
    assert rss > 10 * 2**20  # a Python process with torch imported
    before = usage.in_use
    block = bytearray(64 * 2**20)  # malloc hands these out (mmapped at this size)
    assert heap.heap_usage().in_use >= before + 60 * 2**20  # type: ignore[union-attr]
    del block
    assert usage.free_held >= 0


def test_metrics_report_the_servers_memory_and_conversations() -> None:
    app = create_app(ScriptedEngine(), ServerConfig("scripted"))
    with TestClient(app) as client:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        text = client.get("/metrics").text
    found = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("agentcache"))
    assert float(found["agentcache_conversations"]) == 1.0
    assert float(found["agentcache_conversation_bytes"]) > 0
    if heap.resident_bytes() is not None:
        assert float(found["agentcache_resident_bytes"]) > 10 * 2**20
    if heap.heap_usage() is not None:
        assert float(found['agentcache_heap_bytes{kind="in_use"}']) > 0
        assert 'agentcache_heap_bytes{kind="free_held"}' in found


def test_serve_caps_the_arenas_before_loading_the_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentcache.server.cli as serve_cli
    from agentcache.cli import main
    from agentcache.errors import ConfigError

    order: list[str] = []
    monkeypatch.setattr(serve_cli, "limit_arenas", lambda n: order.append(f"arenas {n}"))

    def no_engine(*args: object) -> None:
        order.append("engine")
        raise ConfigError("stop here")

    monkeypatch.setattr(serve_cli, "serving_engine", no_engine)
    assert main(["serve", "--port", "0", "--malloc-arenas", "4"]) == 2
    assert order == ["arenas 4", "engine"]
    order.clear()
    assert main(["serve", "--port", "0"]) == 2
    assert order == ["arenas 2", "engine"]  # the default
    order.clear()
    assert main(["serve", "--port", "0", "--malloc-arenas", "0"]) == 2  # glibc's own arenas
    assert order == ["engine"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--malloc-arenas", "-1"])
    assert "--malloc-arenas" in capsys.readouterr().err


def test_metrics_report_the_batched_schedulers_counts() -> None:
    from agentcache.runtime.scheduler import BatchStats
    from agentcache.server.metrics import BATCH_KINDS, ServerMetrics, batch_stats

    stats = BatchStats(steps=9, batched_rows=30, solo_feeds=0, peak_batch=4, preempted=3,
                       resumed=2, swapped_bytes=4096, recomputed_tokens=17,
                       waiting_preempted=1,
                       step_seconds={"attention:dense": 1.5, "rest": 2.25,
                                     "alone": 0.5})  # fmt: skip
    text = ServerMetrics(lambda: {}, batch=lambda: stats).render().decode()
    found = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("agentcache"))
    for kind in BATCH_KINDS:
        assert float(found[f'agentcache_batch{{kind="{kind}"}}']) == getattr(stats, kind)
    for part, seconds in stats.step_seconds.items():
        assert float(found[f'agentcache_step_seconds{{part="{part}"}}']) == seconds
    # an engine without a batched scheduler reports no batch counts
    assert batch_stats(ScriptedEngine()) is None
    bare = ServerMetrics(lambda: {}).render().decode()
    assert 'agentcache_batch{kind="steps"}' not in bare
    assert 'agentcache_batch{kind="preempted"}' not in bare
    assert "agentcache_step_seconds{" not in bare


def test_metrics_report_the_vllm_backends_preemptions_alone() -> None:
    """The vLLM backend has no batched scheduler: its count of vLLM's preemptions is the one
    batch count it reports; an engine with neither reports none."""
    from types import SimpleNamespace

    from agentcache.server.metrics import ServerMetrics, engine_preemptions

    backend = SimpleNamespace(preemptions=5)
    assert engine_preemptions(backend) == 5
    assert engine_preemptions(ScriptedEngine()) is None
    assert engine_preemptions(SimpleNamespace(preemptions=True)) is None  # not a count
    text = ServerMetrics(lambda: {}, preemptions=lambda: engine_preemptions(backend)).render()
    lines = [x for x in text.decode().splitlines() if x.startswith("agentcache_batch{")]
    assert lines == ['agentcache_batch{kind="preempted"} 5.0']
