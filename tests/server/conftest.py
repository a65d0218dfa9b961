from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from agentcache.model.loading import LoadedModel
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, ServerLimits, create_app
from agentcache.server.inprocess import serve_in_thread

MODEL = "tiny"
# small limits, so that each bad-input test exceeds one cheaply
LIMITS = ServerLimits(
    max_body_bytes=64 * 1024, max_depth=32, max_messages=16, max_tools=4, max_stop=4,
    max_stop_chars=32, max_user_chars=64, max_content_chars=2000,
)  # fmt: skip


def tiny_app(
    model: LoadedModel, strategy: str = DEFAULT_STRATEGY, kv_pages: int = 512, **config: Any
) -> FastAPI:
    engine = Engine(model, EngineConfig(strategy=strategy, kv_pages=kv_pages))
    return create_app(engine, ServerConfig(MODEL, default_max_tokens=8, **config))


@pytest.fixture
def server_url(tiny: LoadedModel) -> Iterator[str]:
    with serve_in_thread(tiny_app(tiny)) as url:
        yield url


@pytest.fixture(scope="module")
def client(tiny: LoadedModel) -> Iterator[TestClient]:
    """In-process (ASGI) client of a tiny-model server with `LIMITS`: the bad-input tests'."""
    engine = Engine(tiny, EngineConfig(kv_pages=64))
    app = create_app(engine, ServerConfig(MODEL, default_max_tokens=2, limits=LIMITS))
    with TestClient(app) as c:
        yield c
