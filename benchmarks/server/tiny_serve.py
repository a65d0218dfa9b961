"""`python benchmarks/server/tiny_serve.py --port PORT [--strategy S]`: `agentcache
serve`'s app on the seeded tiny random model (`agentcache.testing.tiny_model`), for tests and
smoke runs of the server benchmarks; `agentcache serve` itself loads only model folders. It
serves on 127.0.0.1 until terminated."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    from agentcache.server.store_options import STORE_BYTES, add_store_arguments, tier_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--strategy", default=None, help="reuse strategy (default: the default one)")
    p.add_argument("--served-model-name", default="tiny")
    p.add_argument("--max-active", type=int, default=4)
    p.add_argument("--kv-pages", type=int, default=1024)
    p.add_argument("--retention-share", type=float, default=0.25)
    add_store_arguments(p)  # --store-bytes and the tiers below it, as `agentcache serve` has them
    p.set_defaults(backend="embedded")
    args = p.parse_args(argv)

    import torch
    import uvicorn

    from agentcache.reuse import DEFAULT_STRATEGY
    from agentcache.runtime.engine import Engine, EngineConfig
    from agentcache.server import ServerConfig, create_app
    from agentcache.testing import tiny_model

    torch.set_num_threads(1)
    strategy = args.strategy or DEFAULT_STRATEGY
    # batched decode, as serve has it by default
    engine = Engine(tiny_model(), EngineConfig(
        strategy, kv_pages=args.kv_pages, batch_decode=True, tiers=tier_config(args),
        store_bytes=args.store_bytes or STORE_BYTES,
    ))  # fmt: skip
    config = ServerConfig(args.served_model_name, max_active=args.max_active,
                          retention_share=args.retention_share)  # fmt: skip
    uvicorn.run(create_app(engine, config), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
