from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI

from agentcache.model.loading import LoadedModel
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app

MODEL = "tiny"


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Run `app` under uvicorn on an ephemeral loopback port; yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def tiny_app(model: LoadedModel, strategy: str = DEFAULT_STRATEGY, kv_pages: int = 512) -> FastAPI:
    engine = Engine(model, EngineConfig(strategy=strategy, kv_pages=kv_pages))
    return create_app(engine, ServerConfig(MODEL, default_max_tokens=8))


@pytest.fixture
def server_url(tiny: LoadedModel) -> Iterator[str]:
    with live_server(tiny_app(tiny)) as url:
        yield url
