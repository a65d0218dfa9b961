from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentcache.cli import build_parser, main
from agentcache.reuse import STRATEGIES


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
