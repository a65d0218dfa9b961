from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agentcache.cli import ModelCommand, build_parser, main
from agentcache.decode.config import DecodeConfig
from agentcache.engines.vllm import installed_vllm_version
from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache.server.cli import served_name, server_config
from tests.conftest import no_model, usage_error


def test_serve_arguments() -> None:
    args = build_parser().parse_args(["serve", "--port", "0", "--strategy", "epic"])
    assert args.func == ModelCommand("agentcache.server.cli", "serve")
    assert (args.host, args.port, args.strategy, args.max_tokens) == ("127.0.0.1", 0, "epic", 256)
    assert args.served_model_name is None


def test_history_is_the_tenants_unless_conversations_are_isolated() -> None:
    parse = build_parser().parse_args
    assert not server_config(parse(["serve"]), "m").isolate_conversations
    assert server_config(parse(["serve", "--isolate-conversations"]), "m").isolate_conversations


def test_stored_response_bounds_are_flags() -> None:
    parse = build_parser().parse_args
    default = server_config(parse(["serve"]), "m")
    assert (default.max_stored_responses, default.stored_response_ttl_s) == (4096, 3600.0)
    argv = ["serve", "--stored-responses", "0", "--stored-response-bytes", "1024",
            "--stored-response-ttl", "60"]  # fmt: skip
    c = server_config(parse(argv), "m")
    assert (c.max_stored_responses, c.stored_response_bytes, c.stored_response_ttl_s) == (
        0, 1024, 60.0,
    )  # fmt: skip


def test_served_name_drops_the_weights_fingerprint() -> None:
    assert served_name("smollm2-135m-instruct#1a2b3c") == "smollm2-135m-instruct"
    assert served_name("plain") == "plain"


def test_serve_backend_defaults_to_embedded() -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.backend, args.vllm_reuse, args.store_dir) == ("embedded", "agentcache", None)
    args = build_parser().parse_args(["serve", "--backend", "vllm", "--vllm-reuse", "prefix"])
    assert (args.backend, args.vllm_reuse) == ("vllm", "prefix")


def test_serve_on_vllm_checks_the_fill_against_the_strategy_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A strategy a staged prefill cannot run is named before vLLM is even looked for."""
    argv = ["serve", "--backend", "vllm", "--port", "0", "--vllm-fill", "vllm"]
    assert main([*argv, "--strategy", "rpdc"]) == 2
    err = capsys.readouterr().err
    assert "'rpdc' cannot run as a staged prefill" in err and "Traceback" not in err
    assert build_parser().parse_args([*argv, "--strategy", "pic"]).vllm_fill == "vllm"


def test_serve_on_vllm_without_vllm_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever this venv holds: vLLM reported absent gives the extra and exit code 2."""
    import agentcache.engines.vllm as vllm_pkg

    monkeypatch.setattr(vllm_pkg, "installed_vllm_version", lambda: None)
    assert main(["serve", "--backend", "vllm", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "pip install 'agentcache[vllm]'" in err
    assert "Traceback" not in err


@pytest.mark.skipif(installed_vllm_version() is not None, reason="vLLM is installed here")
def test_serve_on_vllm_without_vllm_exits_2_from_the_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentcache.cli", "serve", "--backend", "vllm", "--port", "0"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )  # fmt: skip
    assert proc.returncode == 2
    assert "pip install 'agentcache[vllm]'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [("nope", "nope"), ("flexicache:fast=1", "keys: verify"), ("quest:verify=-1", "verify")],
)
def test_serve_rejects_a_bad_decode_policy_before_loading(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--decode", spec, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"--decode {spec}" in err and message in err and "Traceback" not in err


def serve_engine(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str
) -> Engine:
    """The engine `agentcache serve ARGV` builds, on the tiny model."""
    import agentcache.model.loading as loading
    from agentcache.server.cli import serving_engine

    monkeypatch.setattr(loading, "load_model", lambda model, cache_dir: tiny)
    engine = serving_engine(build_parser().parse_args(["serve", *argv]), None, tmp_path)
    assert isinstance(engine, Engine)
    return engine


def test_serve_builds_the_engine_with_the_decode_policy(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = serve_engine(tiny, monkeypatch, tmp_path, "--decode", "quest:verify=4:budget=8")
    assert engine.config.decode == DecodeConfig(
        "quest", budget_pages=8, verify=4, profile_dir=tmp_path / "profiles"
    )


@pytest.mark.parametrize(
    ("argv", "store_bytes"), [([], 4 << 30), (["--store-bytes", "12345"], 12345)]
)
def test_serve_sets_the_store_size(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
    store_bytes: int,
) -> None:  # fmt: skip
    engine = serve_engine(tiny, monkeypatch, tmp_path, *argv)
    assert engine.store.capacity_bytes == store_bytes


def test_serve_on_a_port_in_use_fails_before_loading(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"agentcache: error: cannot listen on 127.0.0.1:{port} (Address already in use)" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--strategy", "nope"], "unknown reuse strategy 'nope'"),
        (["--strategy", "rpdc:ratio=0.5"], "unknown reuse strategy 'rpdc:ratio=0.5'"),
        (["--served-model-name", ""], "--served-model-name must not be empty"),
    ],
)
def test_serve_rejects_bad_names_before_loading(
    argv: list[str], needle: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    assert main(["serve", "--port", "0", *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--port", "-1"], "argument --port: must be a port number from 0 to 65535"),
        (["--port", "99999"], "argument --port: must be a port number from 0 to 65535"),
        (["--kv-pages", "0"], "argument --kv-pages: must be an integer >= 1, got '0'"),
        (["--max-tokens", "-5"], "argument --max-tokens: must be an integer >= 1, got '-5'"),
        (["--max-model-len", "0"], "argument --max-model-len: must be an integer >= 1"),
    ],
)
def test_serve_rejects_numbers_out_of_range(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(["serve", *argv], capsys)


def test_serve_holds_its_port_from_the_check_until_uvicorn_serves_on_it(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    import agentcache.server.cli as serve_cli
    from agentcache.errors import ConfigError
    from agentcache.runtime.engine import Engine

    held: list[int] = []

    def load_engine(args: object, model: object, cache_dir: object) -> Engine:
        port = held[0] if held else 0
        with pytest.raises(ConfigError, match="Address already in use"):
            serve_cli.bind_address("127.0.0.1", port)  # nobody can take it while loading
        return Engine(tiny)

    served: list[socket.socket] = []

    def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
        served.extend(sockets)
        assert sockets[0].getsockname()[1] == held[0]

    real_bind = serve_cli.bind_address

    def bind(host: str, port: int) -> socket.socket:
        sock = real_bind(host, port)
        held.append(sock.getsockname()[1])
        return sock

    monkeypatch.setattr(serve_cli, "serving_engine", load_engine)
    monkeypatch.setattr(serve_cli, "bind_address", bind)
    monkeypatch.setattr(uvicorn.Server, "run", run)
    assert main(["serve", "--port", "0"]) == 0
    assert len(served) == 1 and served[0].fileno() == -1  # closed once the server is done
    err = capsys.readouterr().err
    assert f"on http://127.0.0.1:{held[0]} (Ctrl+C to quit)" in err
    defaults = "at most 16 requests at the engine, 14 of them one tenant's while others have "
    assert defaults + "requests (" in err


@pytest.mark.parametrize(
    ("argv", "policy", "host_bytes"),
    [
        ([], None, 1 << 30),
        (["--preemption", "recompute"], "recompute", 1 << 30),
        (["--preemption", "swap", "--preemption-host-bytes", "64MiB"], "swap", 64 << 20),
    ],
)
def test_serve_sets_the_preemption_policy(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
    policy: str | None, host_bytes: int,
) -> None:  # fmt: skip
    engine = serve_engine(tiny, monkeypatch, tmp_path, *argv)
    assert (engine.config.preemption, engine.config.preemption_host_bytes) == (policy, host_bytes)
    assert engine.config.prefill_order == "shortest"  # the default
    assert (engine.batch is not None and engine.batch.preemption is not None) == (
        policy is not None
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preemption", "swap", "--no-batch-decode"], "--preemption needs"),
        (["--preemption", "recompute", "--backend", "vllm"], "--preemption needs"),
        (["--preemption-host-bytes", "1GiB"], "--preemption-host-bytes applies"),
        (["--preemption", "recompute", "--preemption-host-bytes", "1GiB"], "applies to"),
        (["--prefill-order", "shortest", "--backend", "vllm"], "--prefill-order applies"),
        (["--prefill-burst-tokens", "512", "--backend", "vllm"], "--prefill-burst-tokens needs"),
        (["--prefill-burst-tokens", "512", "--no-batch-decode"], "--prefill-burst-tokens needs"),
        (["--no-share-pages", "--backend", "vllm"], "--no-share-pages applies"),
    ],
)
def test_bad_preemption_flags_fail_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
    message: str,
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unknown_preemption_policy_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = usage_error(["serve", "--preemption", "drop"], capsys)
    assert "--preemption" in err and "swap" in err


def test_the_admission_summary_names_the_token_bound_where_there_is_one() -> None:
    from agentcache.server import ServerConfig
    from agentcache.server.cli import admission_summary

    bounded = admission_summary(ServerConfig("m", max_active=256, max_active_tokens=23296))
    assert bounded.startswith("at most 256 requests at the engine, 224 of them one tenant's while "
                              "others have requests; "
                              "at most 23296 tokens (prompt + max_tokens) reserved")  # fmt: skip
    assert "tokens" not in admission_summary(ServerConfig("m")).split("(")[0]


def test_serve_sets_the_prefill_order(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = serve_engine(tiny, monkeypatch, tmp_path, "--prefill-order", "arrival")
    assert engine.config.prefill_order == "arrival" and not engine._lock.shortest_first
    assert engine._lock.burst_tokens == EngineConfig().prefill_burst_tokens  # the default


def test_serve_shares_pages_unless_told_not_to(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = serve_engine(tiny, monkeypatch, tmp_path)
    assert shared.config.share_pages and shared.shared is not None
    apart = serve_engine(tiny, monkeypatch, tmp_path, "--no-share-pages")
    assert not apart.config.share_pages and apart.shared is None


def test_serve_sets_the_prefill_burst(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = serve_engine(tiny, monkeypatch, tmp_path, "--prefill-burst-tokens", "777")
    assert engine.config.prefill_burst_tokens == 777 and engine._lock.burst_tokens == 777
