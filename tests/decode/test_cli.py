from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.cli import build_parser, main


def test_subcommands_are_registered_with_their_defaults() -> None:
    args = build_parser().parse_args(["bench-decode"])
    assert (args.context, args.new_tokens, args.policies) == (
        8192,
        256,
        "dense,flexicache,multiscale",
    )
    args = build_parser().parse_args(["profile-heads", "--unstable-fraction", "0.3"])
    assert args.unstable_fraction == 0.3 and args.gqa == "sum"


def test_bench_decode_rejects_a_context_without_room_for_new_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench-decode", "--context", "100", "--new-tokens", "200"]) == 2
    assert "context > new_tokens" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["profile-heads", "bench-decode"])
def test_missing_prompts_file_is_a_clear_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, str(tmp_path / "nope.txt"), "--threads", "1"]) == 2
    assert "nope.txt does not exist" in capsys.readouterr().err


def test_bench_decode_rejects_an_unknown_policy_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-decode", "--policies", "dense,flexicache:fast=1"]) == 2
    assert "flexicache:fast=1" in capsys.readouterr().err
