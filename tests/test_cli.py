from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.cli import build_parser, main
from agentcache.errors import ModelLoadError
from agentcache.model.loading import LoadedModel
from agentcache.reuse import STRATEGIES
from tests.conftest import usage_error


def subcommands() -> dict[str, str]:
    """name -> the help line the top-level parser shows for it."""
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return {c.dest: str(c.help) for c in action._choices_actions}  # type: ignore[attr-defined]


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width
    assert "KV-cache reuse for LLM agents." in out
    for name, help_line in subcommands().items():
        assert f"{name} {help_line}" in out


def test_known_subcommands() -> None:
    assert {"demo", "strategies"} <= set(subcommands())


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_subcommand_help_exits_zero(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: agentcache {command}")


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_subcommand_help_shows_description(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert subcommands()[command] in " ".join(capsys.readouterr().out.split())


def test_demo_help_lists_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    for opt in ("--model", "--cache-dir", "--threads", "--strategies", "--turns", "--tokens"):
        assert opt in out


def test_strategies_lists_full_and_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    lines = capsys.readouterr().out.split()
    assert "full" in lines and "prefix" in lines
    assert lines == STRATEGIES.names()


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert "required" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    assert "frobnicate" in capsys.readouterr().err


def test_demo_with_missing_model_folder_reports_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test
    missing = tmp_path / "no-model"
    threads = str(torch.get_num_threads())  # leave the process's thread count as it is
    code = main(
        ["demo", "--model", str(missing), "--cache-dir", str(tmp_path), "--threads", threads]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("agentcache: error: ")
    assert str(missing) in err and "does not exist" in err


def test_demo_with_a_model_file_says_it_is_not_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"\0")
    threads = str(torch.get_num_threads())
    assert (
        main(["demo", "--model", str(file), "--cache-dir", str(tmp_path), "--threads", threads])
        == 2
    )
    assert f"model folder {file} is a file" in capsys.readouterr().err


THREADS = "an integer from 0 to 1024 (0: all cores)"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["demo", "--turns", "0"], "argument --turns: must be an integer >= 1, got '0'"),
        (["demo", "--tokens", "-1"], "argument --tokens: must be an integer >= 0, got '-1'"),
        (["demo", "--threads", "-1"], f"argument --threads: must be {THREADS}, got '-1'"),
        (["bench-decode", "--threads", "x"], f"argument --threads: must be {THREADS}"),
        (["serve", "--threads", "9" * 23], f"argument --threads: must be {THREADS}, got '999"),
        (["serve", "--threads", "1025"], f"argument --threads: must be {THREADS}, got '1025'"),
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(argv, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--store-disk-dir", ""],
        ["serve", "--store-dir", ""],
        ["bench-tiers", "w.jsonl", "--disk-dir", " "],
        ["bench", "w.jsonl", "--out", ""],
        ["demo", "--model", ""],
        ["demo", "--cache-dir", ""],
        ["replay-trace", ""],
    ],
    ids=[
        "serve-disk-dir",
        "serve-store-dir",
        "bench-tiers-disk-dir",
        "bench-out",
        "model",
        "cache-dir",
        "trace",
    ],
)
def test_an_empty_path_is_a_usage_error_and_writes_nothing(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """An empty name (an unset shell variable) would be the current folder: a disk tier's
    journal and lock were written there."""
    monkeypatch.chdir(tmp_path)
    err = usage_error(argv, capsys)
    assert "must name a file or folder, got '" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-2", "many", "4096"])
def test_a_bad_thread_count_in_the_environment_is_named(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTCACHE_NUM_THREADS", value)
    assert main(["demo", "--model", str(tmp_path / "none"), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"agentcache: error: AGENTCACHE_NUM_THREADS must be {THREADS}, got '{value}'" in err


def test_demo_rejects_bad_strategy_options_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-model"  # loading it would fail with another message
    threads = str(torch.get_num_threads())
    argv = ["demo", "--model", str(missing), "--threads", threads, "--strategies", "rpdc:extra=x"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "strategy 'rpdc:extra=x': extra must be a number, got 'x'" in err


def _failing_load(*_: object) -> LoadedModel:
    raise ModelLoadError("no weights here")


def test_a_failed_command_removes_the_output_folders_it_left_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", _failing_load)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("some text")
    kept = tmp_path / "kept"  # existed before: stays, as does what it holds
    (kept / "old").mkdir(parents=True)
    for out in (tmp_path / "a" / "b" / "out", kept / "new", kept / "old"):
        argv = ["bench-decode", str(prompts), "--out", str(out), "--threads", "1"]
        assert main(argv) == 2
        assert "no weights here" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "prompts.txt"]
    assert [p.name for p in kept.iterdir()] == ["old"]


def test_a_command_that_succeeds_keeps_its_output_folder(tmp_path: Path) -> None:
    from agentcache.argtypes import end_outputs, output_folder

    out = output_folder(tmp_path / "x" / "out", "--out")
    end_outputs(failed=False)
    end_outputs(failed=True)  # a later failure does not touch an earlier command's folders
    assert out.is_dir()
