from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from agentcache.model.loading import LoadedModel
from agentcache.testing import tiny_model

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _no_grad() -> object:
    with torch.no_grad():
        yield


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request: pytest.FixtureRequest) -> object:
    """Tiny models gain nothing from intra-op threads, and OpenMP workers spinning on a busy
    machine make them 10-20x slower; `slow` tests (the real model) keep every thread."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return tiny_model()


def no_model(*_: object) -> LoadedModel:
    """Stands in for the model loader where arguments must be rejected before any model loads."""
    raise AssertionError("the model was loaded before the arguments were checked")


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI on `argv`, check it stops with a usage error (exit 2), return its stderr."""
    from agentcache.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI on `argv`, check it refuses them with a clear error (exit 2, not a usage
    error), return its stderr (warnings may come before the error)."""
    from agentcache.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "agentcache: error: " in err, err
    return err


def at_once(work: Callable[[int], T], n: int) -> list[T]:
    """`work(0)` .. `work(n - 1)`, each on its own thread, all started before any is joined;
    their results in order."""
    got: dict[int, T] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, work(i))) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [got[i] for i in range(n)]
