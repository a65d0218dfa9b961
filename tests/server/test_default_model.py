"""The server on the real default model (slow): an OpenAI-client loop reuses most of each later
prompt and, at temperature 0, answers as full recompute does."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server import ServerConfig, create_app
from agentcache.server.inprocess import serve_in_thread

SYSTEM = (
    "You are a support agent for a hosting company. Be brief. Refunds are possible within 30 "
    "days; outages are credited at 10% of the monthly bill per hour of downtime. "
) * 3
USERS = ("My server was down for two hours.", "My bill is $40. What is my credit?",
         "Can I get it as a refund instead?")  # fmt: skip


def loop(url: str) -> list[Any]:
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    out = []
    for user in USERS:
        messages.append({"role": "user", "content": user})
        r = c.chat.completions.create(
            model="default",
            messages=messages,
            temperature=0,
            max_tokens=16,  # type: ignore[arg-type]
        )
        out.append(r)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return out


@pytest.mark.slow
def test_default_model_loop_reuses_and_matches_full() -> None:
    from agentcache.model.loading import load_model

    model = load_model()
    runs = {}
    for strategy in ("rpdc", "full"):
        engine = Engine(model, EngineConfig(strategy, kv_pages=512))
        app = create_app(engine, ServerConfig("default"))
        with serve_in_thread(app) as url:
            runs[strategy] = loop(url)
    texts = {s: [r.choices[0].message.content for r in rs] for s, rs in runs.items()}
    assert texts["rpdc"] == texts["full"]
    for r in runs["rpdc"][1:]:
        assert r.usage.prompt_tokens_details.cached_tokens >= 0.7 * r.usage.prompt_tokens
