from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.cli import build_parser, main
from tests.conftest import no_model, refusal, usage_error


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


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bench-decode", "--budget", "0"], "argument --budget: must be an integer >= 1, got '0'"),
        (["bench-decode", "--num-prompts", "0"], "argument --num-prompts: must be an integer >= 1"),
        (["bench-decode", "--needle", "-1"], "argument --needle: must be an integer >= 0"),
        (["bench-decode", "--new-tokens", "-1"], "argument --new-tokens: must be an integer >= 1"),
        (["profile-heads", "--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
        (["profile-heads", "--unstable-fraction", "2"], "argument --unstable-fraction: must be a "
         "number from 0 to 1, got '2'"),
        (["profile-heads", "--context", "x"], "argument --context: must be an integer >= 1"),
    ],
)  # fmt: skip
def test_numbers_out_of_range_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bench-decode", "--policies", "nosuch"], "unknown decode policy 'nosuch'"),
        (["bench-decode", "--policies", "dense", "--out", "{file}"], "--out {file} is a file"),
        (["bench-decode", "--profile", "{tmp}/none.json"], "--profile {tmp}/none.json is not a "
         "file; make one with `agentcache profile-heads --out {tmp}/none.json`"),
        (["profile-heads", "--steps", "1"], "steps >= 2"),
        (["profile-heads", "--context", "1000"], "profiling prompts need more than 66 pages "
         "(1056 tokens); got 1000 tokens"),
        (["profile-heads", "--out", "{tmp}"], "--out {tmp} is a folder; give a file path"),
        (["profile-heads", "--out", "{file}/p.json"], "--out {file}/p.json: folder {file} is a "
         "file, not a folder"),
    ],
)  # fmt: skip
def test_bad_arguments_fail_before_the_model_loads(
    argv: list[str], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    file = tmp_path / "file"
    file.write_text("x")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("some text")
    names = {"file": file, "tmp": tmp_path}
    args = [a.format(**names) for a in argv]
    err = refusal([args[0], str(prompts), *args[1:], "--threads", "1"], capsys)
    assert needle.format(**names) in err


def test_a_prompts_file_that_is_not_text_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "prompts.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    assert main(["bench-decode", str(binary), "--threads", "1"]) == 2
    assert f"prompts file {binary} is not UTF-8 text" in capsys.readouterr().err
