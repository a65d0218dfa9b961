from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentcache.bench.results import write_run


def _render(results: dict[str, Any]) -> str:
    return f"# Run\n\n{results['summary']['ratio']:.2f}x\n"


def test_writes_the_results_and_the_report_rendered_from_them(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"  # parents created
    results = {"provenance": {"command": "python x.py"}, "summary": {"ratio": 1.5}, "rows": [1]}
    report = write_run(out, results, _render)
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "results.json"]
    text = (out / "results.json").read_text(encoding="utf-8")
    assert json.loads(text) == results and list(json.loads(text)) == list(results)
    assert text.endswith("}\n") and text.startswith('{\n "provenance"')  # indent 1
    assert report == (out / "report.md").read_text(encoding="utf-8") == "# Run\n\n1.50x\n"


def test_without_a_renderer_only_the_results_are_written(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("old")
    assert write_run(tmp_path, {"rows": []}) is None
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert json.loads((tmp_path / "results.json").read_text()) == {"rows": []}


def test_a_report_that_fails_leaves_the_results_written(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        write_run(tmp_path, {"rows": [2]}, _render)
    assert json.loads((tmp_path / "results.json").read_text()) == {"rows": [2]}
    assert not (tmp_path / "report.md").exists()


def test_a_value_json_cannot_hold_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(TypeError):
        write_run(out, {"out": Path("x")}, _render)
    assert not out.exists()
