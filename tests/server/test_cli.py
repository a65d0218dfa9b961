from __future__ import annotations

from agentcache.cli import ModelCommand, build_parser
from agentcache.server.cli import served_name


def test_serve_arguments() -> None:
    args = build_parser().parse_args(["serve", "--port", "0", "--strategy", "epic"])
    assert args.func == ModelCommand("agentcache.server.cli", "serve")
    assert (args.host, args.port, args.strategy, args.max_tokens) == ("127.0.0.1", 0, "epic", 256)
    assert args.served_model_name is None


def test_served_name_drops_the_weights_fingerprint() -> None:
    assert served_name("smollm2-135m-instruct#1a2b3c") == "smollm2-135m-instruct"
    assert served_name("plain") == "plain"
