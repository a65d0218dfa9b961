from __future__ import annotations

from pathlib import Path

import pytest

from agentcache.cli import main
from agentcache.testing import tiny_model
from tests.conftest import no_model, usage_error


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
        (["--seq-len", "-8"], "argument --seq-len: must be an integer >= 1, got '-8'"),
        (["--rank", "0"], "argument --rank: must be an integer >= 1, got '0'"),
        (["--lr", "-1"], "argument --lr: must be a finite number > 0, got '-1'"),
        (["--eval-windows", "0"], "argument --eval-windows: must be an integer >= 1"),
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in usage_error(["train-cope", *argv], capsys)


@pytest.mark.parametrize("option", ["--out", "--checkpoint"])
def test_an_unwritable_output_path_fails_before_training(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import agentcache.model.loading as loading

    monkeypatch.setattr(loading, "load_model", no_model)
    file = tmp_path / "file"
    file.write_text("x")
    argv = ["train-cope", option, str(file / "run.json"), "--cache-dir", str(tmp_path)]
    assert main([*argv, "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"agentcache: error: {option} {file}/run.json: folder {file} is a file" in err


def test_eval_only_without_an_adapter_fails_before_measuring_the_base_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentcache.cope.train as train
    import agentcache.model.loading as loading

    def no_perplexity(*_: object) -> float:
        raise AssertionError("the base model was measured before the adapter was found")

    monkeypatch.setattr(loading, "load_model", lambda path, cache_dir: tiny_model())
    monkeypatch.setattr(train, "perplexity", no_perplexity)
    argv = ["train-cope", "--eval-only", "--cache-dir", str(tmp_path), "--seq-len", "16",
            "--eval-windows", "1", "--max-corpus-tokens", "100000", "--threads", "1"]  # fmt: skip
    assert main(argv) == 2
    assert "no CoPE adapter for model" in capsys.readouterr().err
