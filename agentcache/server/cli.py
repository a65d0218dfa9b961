"""`agentcache serve`: the OpenAI-compatible server on the loaded model."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    text = "serve an OpenAI-compatible chat API that reuses agents' KV cache"
    p = sub.add_parser("serve", help=text, description=text)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--strategy", default=None, help="reuse strategy (default: the default one)")
    p.add_argument("--served-model-name", default=None,
                   help="the `model` clients pass (default: the model's name)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=256,
                   help="max_tokens when a request sets none (default: 256)")  # fmt: skip
    share = (
        "let conversations reuse each other's identical messages (outputs then depend on what "
        "else ran; default: only the system prefix is shared)"
    )
    p.add_argument("--share-history", action="store_true", help=share)
    p.add_argument("--kv-pages", type=int, default=2048, help="fast-tier KV pages of 16 tokens")
    return p


def served_name(model_id: str) -> str:
    """`name#weights-fingerprint` -> `name`."""
    return model_id.split("#", 1)[0]


def serve(args: argparse.Namespace, model: str | None, cache_dir: Path) -> int:
    try:
        import uvicorn
    except ImportError:
        print("agentcache serve needs the server extra: pip install 'agentcache[server]'")
        return 2
    from agentcache.model.loading import load_model
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server.app import ServerConfig, create_app

    loaded = load_model(model, cache_dir)
    config = EngineConfig(kv_pages=args.kv_pages)
    if args.strategy:
        config = EngineConfig(strategy=args.strategy, kv_pages=args.kv_pages)
    engine = Engine(loaded, config)
    server = ServerConfig(
        args.served_model_name or served_name(loaded.model_id), args.max_tokens,
        isolate_conversations=not args.share_history,
    )  # fmt: skip
    uvicorn.run(create_app(engine, server), host=args.host, port=args.port, log_level="info")
    return 0
