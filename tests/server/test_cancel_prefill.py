"""A client that leaves while its long prompt is prefilled in chunks (`prefill_chunk_tokens`)
stops that prefill before its next chunk: the server's cancel event reaches the scheduler
through `ChatEngine.run` and `ServingEngine.generate`. The turn is counted as cancelled, its
pages come back, and the next requests get the replies they got before. The first chunk is
held until the client has left, so what ran is counted in chunks, never timed."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from agentcache.model.loading import LoadedModel
from agentcache.runtime import chunked
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread
from tests.server.conftest import MODEL
from tests.server.test_admission_cancel import metric_line, raw_post
from tests.server.test_turns import wait_for

CHUNK = 16  # tokens per chunk: the long prompt is about 40 of them
KV_PAGES = 256
SHORT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 6,
    "temperature": 0,
}
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "x " * 300}],
    "max_tokens": 6,
    "temperature": 0,
}


class HeldChunks:
    """Counts the chunks of prompts of at least `min_tokens`; once `armed`, holds the first
    one it runs (after computing it) until `go_on` is set, `entered` telling it is held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, min_tokens: int) -> None:
        self.min_tokens, self.armed, self.ran = min_tokens, False, 0
        self.entered, self.go_on = threading.Event(), threading.Event()
        run_chunk = chunked.ChunkedPrefill.run_chunk

        def spy(work: chunked.ChunkedPrefill) -> Any:
            result = run_chunk(work)
            if work.prompt.num_tokens >= self.min_tokens:
                self.ran += 1
                if self.armed:
                    self.armed = False
                    self.entered.set()
                    assert self.go_on.wait(60)
            return result

        monkeypatch.setattr(chunked.ChunkedPrefill, "run_chunk", spy)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_mid_prefill_stops_it_before_the_next_chunk(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    config = EngineConfig(strategy="full", kv_pages=KV_PAGES, batch_decode=True,
                          prefill_chunk_tokens=CHUNK)  # fmt: skip
    engine = Engine(tiny, config)
    assert engine.batch is not None
    app: Any = create_app(engine, ServerConfig(MODEL))
    line, pool = app.state.line, engine.ctx.pool
    held = HeldChunks(monkeypatch, min_tokens=20 * CHUNK)
    post = "/v1/chat/completions"
    gone = f'agentcache_requests_total{{endpoint="{post}",status="499"}}'
    with serve_in_thread(app) as url:
        short_before = httpx.post(f"{url}{post}", json=SHORT, timeout=60).json()
        long_before = httpx.post(f"{url}{post}", json=LONG, timeout=60).json()
        chunks_alone = held.ran  # the long prompt's chunks, run to its end
        free = pool.num_free
        held.armed, held.ran = True, 0
        sock = raw_post(url, post, {**LONG, "stream": stream})
        assert held.entered.wait(60)
        sock.close()
        wait_for(lambda: metric_line(httpx.get(f"{url}/metrics").text,
                                     "agentcache_cancelled_total") == 1)  # fmt: skip
        held.go_on.set()
        wait_for(lambda: line.active == 0 and pool.num_free == free)
        ran_cancelled = held.ran
        short_after = httpx.post(f"{url}{post}", json=SHORT, timeout=60).json()
        long_after = httpx.post(f"{url}{post}", json=LONG, timeout=60).json()
        metrics = httpx.get(f"{url}/metrics").text
    assert chunks_alone > 20 and ran_cancelled == 1  # no chunk after the client left
    assert engine.batch.running == 0 and pool.num_free == KV_PAGES
    for before, after in ((short_before, short_after), (long_before, long_after)):
        reply = before["choices"][0]["message"]["content"]
        assert after["choices"][0]["message"]["content"] == reply
    assert metric_line(metrics, "agentcache_cancelled_total") == 1
    assert metric_line(metrics, gone) == (0 if stream else 1)  # a stream's 200 was sent
