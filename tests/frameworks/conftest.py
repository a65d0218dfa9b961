"""Two real `agentcache serve` processes on the embedded default model, started once for the whole
session: the default strategy, and `--strategy full` (nothing reused), the reference every
framework's loop must answer identically to. `ReuseLog` records what the server said about
reuse on each HTTP response (the `X-Agentcache-*` headers), whatever client sent it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from agentcache.testing import ServeProcess

STRATEGIES = ("default", "full")
# "ROOT_URL,ROOT_URL": servers on the default strategy and on --strategy full to use instead
SERVERS_ENV = "AGENTCACHE_TEST_SERVERS"
MODEL = "agentcache-default"


@dataclass(frozen=True)
class Running:
    url: str

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@dataclass(frozen=True)
class Servers:
    default: ServeProcess | Running
    full: ServeProcess | Running

    def __getitem__(self, strategy: str) -> ServeProcess | Running:
        return {"default": self.default, "full": self.full}[strategy]


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    if running := os.environ.get(SERVERS_ENV):  # two servers already up: iterate on one test
        default, full = (Running(u.rstrip("/")) for u in running.split(","))
        yield Servers(default, full)
        return
    # one torch thread each: the two share the machine, and a test talks to one at a time
    argsets = (["--threads", "1"], ["--threads", "1", "--strategy", "full"])
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda a: ServeProcess(a, model_name=MODEL), argsets))
    try:
        yield Servers(*started)
    finally:
        for s in started:
            s.close()


@dataclass(frozen=True)
class Exchange:
    """One HTTP response of the server: the path and what it reported about the prompt."""

    path: str
    status: int
    prompt_tokens: int | None  # None: a streamed reply (the headers come before the prompt is run)
    reused_tokens: int | None


@dataclass
class ReuseLog:
    """Pass `hooks` (sync clients) or `async_hooks` (async clients) as httpx `event_hooks`."""

    exchanges: list[Exchange] = field(default_factory=list)

    def _record(self, r: httpx.Response) -> None:
        def header(name: str) -> int | None:
            v = r.headers.get(name)
            return None if v is None else int(v)

        self.exchanges.append(Exchange(r.request.url.path, r.status_code,
                                       header("x-agentcache-prompt-tokens"),
                                       header("x-agentcache-reused-tokens")))  # fmt: skip

    @property
    def hooks(self) -> dict[str, list[object]]:
        return {"response": [self._record]}

    @property
    def async_hooks(self) -> dict[str, list[object]]:
        async def record(r: httpx.Response) -> None:
            self._record(r)

        return {"response": [record]}

    def calls(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == path]


def assert_warm_steps_reuse(reused: list[int], prompts: list[int] | None = None) -> None:
    """Every step after the first found cached tokens: the loop resends its history, so each
    warm step's prompt starts with the previous one's."""
    assert len(reused) >= 2, f"a multi-step loop was expected; got {len(reused)} model calls"
    assert all(r > 0 for r in reused[1:]), f"warm steps without cached tokens: {reused}"
    if prompts is not None:
        assert all(r <= p for r, p in zip(reused, prompts, strict=True)), (reused, prompts)
