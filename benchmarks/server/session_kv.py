#!/usr/bin/env python3
"""The KV the replay's sessions hold, and the store sizes a replay under store pressure needs.

    HF_HUB_OFFLINE=1 python benchmarks/server/session_kv.py --split validate --share 0.25

Each session's KV at its end: its last request's prompt tokens, as the server counts them (its
chat template and tools block, the engine's tokenizer: `ChatEngine.count_tokens`), plus that
turn's reply budget, times the model's KV bytes per token. Printed per session, then for the
sessions together: the store that holds `--share` of their KV; the KV pool (`--kv-pages`, 16
tokens a page) that holds the longest session; and the least fast tier a tiered store on that
pool may have (one request's working set, the pool's tokens of KV: `TierConfig.check_working_set`).
No forward pass runs.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE_TOKENS = 16
MiB = 1 << 20


def session_tokens(chat: Any, sessions: list[Any]) -> list[tuple[str, int, int]]:
    """(name, last prompt's tokens, last reply's budget) of each session."""
    from agentcache.server.convert import to_chat_request
    from agentcache.server.schemas import ChatCompletionRequest

    out = []
    for s in sessions:
        last = s.requests[-1]
        body = ChatCompletionRequest(model="m", messages=last["messages"],
                                     tools=last["tools"] or None)  # fmt: skip
        request, _ = to_chat_request(body, None, "replay", s.max_tokens[-1])
        out.append((s.name, chat.count_tokens(request), s.max_tokens[-1]))
    return out


def sizes(tokens: list[tuple[str, int, int]], token_bytes: int, share: float) -> dict[str, int]:
    """The sessions' KV in all, `share` of it, the pool pages the longest session needs, and
    the least fast tier on that pool (bytes)."""
    total = sum(p + r for _, p, r in tokens)
    pages = math.ceil(max(p + r for _, p, r in tokens) / PAGE_TOKENS)
    return {"tokens": total, "kv_bytes": total * token_bytes,
            "share_bytes": int(share * total * token_bytes), "kv_pages": pages,
            "min_fast_bytes": pages * PAGE_TOKENS * token_bytes}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", type=Path, default=ROOT / "benchmarks/workloads/chat.jsonl")
    p.add_argument("--split", default="validate", choices=("tune", "validate", "all"))
    p.add_argument("--model", default="default", help="tiny, default or a model folder")
    p.add_argument("--share", type=float, default=0.25, help="of the sessions' KV, the store's")
    args = p.parse_args(argv)

    from agentcache.bench.server.agents import load_sessions
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server import ServerConfig, create_app

    if args.model == "tiny":
        from agentcache.testing import tiny_model

        model = tiny_model()
    else:
        from agentcache.model.loading import default_cache_dir, load_model

        model = load_model(None if args.model == "default" else args.model, default_cache_dir())
    engine = Engine(model, EngineConfig())  # pages take memory only once used: none here
    token_bytes = engine.pool_config.page_bytes // engine.pool_config.page_size
    app = create_app(engine, ServerConfig("m"))
    tokens = session_tokens(app.state.chat, load_sessions(args.workload, args.split))
    for name, prompt, reply in tokens:
        print(f"{name}: {prompt} prompt + {reply} reply tokens, "
              f"{(prompt + reply) * token_bytes / MiB:.1f} MiB of KV")  # fmt: skip
    s = sizes(tokens, token_bytes, args.share)
    print(
        f"all {len(tokens)}: {s['tokens']} tokens x {token_bytes} bytes = "
        f"{s['kv_bytes'] / MiB:.1f} MiB; {args.share:g} of it {s['share_bytes'] / MiB:.1f} MiB"
    )
    print(f"pool for the longest: --kv-pages {s['kv_pages']}; a fast tier on it holds at "
          f"least {s['min_fast_bytes'] / MiB:.2f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
