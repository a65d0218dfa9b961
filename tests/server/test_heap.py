"""The server hands freed heap memory back on a timer (server/heap.py)."""

from __future__ import annotations

import threading

import pytest
from starlette.testclient import TestClient

from agentcache.cli import build_parser
from agentcache.server import ServerConfig, create_app
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
