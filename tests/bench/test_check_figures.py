from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "figures.toml"


def test_every_figure_quoted_in_readme_and_docs_matches_its_stored_file() -> None:
    cf = load_script("check_figures")
    assert cf.check(MANIFEST, ROOT) == []


def test_a_tampered_readme_fails_naming_the_figure(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    readme = (ROOT / "README.md").read_text()
    assert "ranges from 0.45x on memgpt" in readme
    (tmp_path / "README.md").write_text(readme.replace(" 0.45x on memgpt", " 0.15x on memgpt"))
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    errors = [e for e in cf.check(MANIFEST, tmp_path) if e.startswith("README")]
    assert len(errors) == 3  # two figures quote 0.45, and 0.15x is declared by none
    assert errors[0].startswith("README.md: 0.45 ")
    assert errors[2].startswith("README.md: 0.15x ") and "no entry declares" in errors[2]
    assert "no longer contains" in errors[0]


def write_case(root: Path, value: float, text: str = "speedup 2.26x over prefix") -> Path:
    (root / "page.md").write_text(f"# Page\n\nThe {text}\ncaching.\n")
    runs = [{"config": c, "session": "s", "turn": t, "ttft_ms": ms}
            for t in range(3) for c, ms in (("prefix", 100.0), ("x", 100.0 / value))]  # fmt: skip
    runs.append({"config": "x", "session": "s", "turn": 3, "ttft_ms": 100.0 / value})
    runs.append({"config": "prefix", "session": "s", "turn": 3, "ttft_ms": 100.0})
    (root / "r.json").write_text(json.dumps({"records": runs, "n": 7}))
    manifest = root / "figures.toml"
    manifest.write_text(
        '[paths]\nR = "r.json"\n\n[[figure]]\ndoc = "page.md"\n'
        'context = "speedup 2.26x over prefix caching"\nfigure = "2.26"\n'
        "value = \"median(vs(R, 'x', 'prefix'))\"\n"
    )
    return manifest


def test_a_figure_passes_within_half_a_unit_of_its_last_digit(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    assert cf.check(write_case(tmp_path, 2.2649), tmp_path) == []
    assert cf.main(["--manifest", str(tmp_path / "figures.toml"), "--root", str(tmp_path)]) == 0


def test_a_changed_result_fails_naming_the_figure_and_the_value(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    errors = cf.check(write_case(tmp_path, 2.2651), tmp_path)
    assert len(errors) == 1
    assert errors[0].startswith("page.md: 2.26 ")
    assert "value 2.2651" in errors[0]
    assert cf.main(["--manifest", str(tmp_path / "figures.toml"), "--root", str(tmp_path)]) == 1


def test_a_figure_moved_out_of_its_context_or_a_longer_number_fails(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    manifest = write_case(tmp_path, 2.26, text="speedup 2.265x over prefix")
    short = manifest.read_text().replace("x over prefix caching", "")  # context "speedup 2.26"
    manifest.write_text(short)
    errors = cf.check(manifest, tmp_path)
    assert len(errors) == 1 and "no longer contains 'speedup 2.26'" in errors[0]
    manifest.write_text(short.replace('figure = "2.26"', 'figure = "2.27"'))
    assert "is not inside its context" in cf.check(manifest, tmp_path)[0]


def test_warm_pairs_turns_by_session_and_leaves_the_cold_turn_out(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    recs = [
        {"config": "prefix", "session": "a", "turn": 0, "ttft_ms": 50.0},
        {"config": "x", "session": "a", "turn": 0, "ttft_ms": 500.0},
        {"config": "x", "session": "b", "turn": 1, "ttft_ms": 10.0},
        {"config": "x", "session": "a", "turn": 1, "ttft_ms": 40.0},
        {"config": "prefix", "session": "a", "turn": 1, "ttft_ms": 80.0},
        {"config": "prefix", "session": "b", "turn": 1, "ttft_ms": 30.0},
    ]
    (tmp_path / "r.json").write_text(json.dumps({"records": recs}))
    results = cf.Results(tmp_path)
    assert sorted(results.vs("r.json", "x", "prefix")) == [2.0, 3.0]
    assert results.warm("r.json", "x", "ttft_ms") == [10.0, 40.0]
    assert results.vs("r.json", "x", "prefix", session="a") == [2.0]
    assert results.warm("r.json", "x", "ttft_ms", session="b") == [10.0]
    assert cf.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert cf.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0


def test_a_run_in_rounds_pairs_each_turn_with_its_own_round(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    recs = [
        {"config": "prefix", "session": "a", "turn": 1, "round": 0, "ttft_ms": 80.0},
        {"config": "x", "session": "a", "turn": 1, "round": 0, "ttft_ms": 40.0},
        {"config": "prefix", "session": "a", "turn": 1, "round": 1, "ttft_ms": 30.0},
        {"config": "x", "session": "a", "turn": 1, "round": 1, "ttft_ms": 10.0},
    ]
    (tmp_path / "r.json").write_text(json.dumps({"records": recs}))
    assert sorted(cf.Results(tmp_path).vs("r.json", "x", "prefix")) == [2.0, 3.0]


def test_tolerance_follows_the_written_digits() -> None:
    cf = load_script("check_figures")

    assert cf.half_unit("2.26") == pytest.approx(0.005)
    assert cf.half_unit("1.2e-03") == pytest.approx(5e-5)
    assert cf.half_unit("120") == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('doc = "page.md"\ncontext = "x"\nfigure = "1"\n', "missing ['value']"),
        ('doc = "p"\ncontext = "1"\nfigure = "1"\nvalue = "1"\nunit = "x"\n', "unknown ['unit']"),
        ('doc = "p"\ncontext = "one"\nfigure = "one"\nvalue = "1"\n', "'one' is not a number"),
    ],
)
def test_a_malformed_manifest_is_a_clear_error(
    tmp_path: Path, entry: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cf = load_script("check_figures")
    manifest = tmp_path / "figures.toml"
    manifest.write_text("[[figure]]\n" + entry)
    assert cf.main(["--manifest", str(manifest), "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "figure #0" in err and message in err


def test_an_expression_that_fails_is_reported_not_raised(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    manifest = write_case(tmp_path, 2.26)
    text = manifest.read_text().replace("median(vs(R, 'x', 'prefix'))", "get(R, 'missing')")
    manifest.write_text(text)
    errors = cf.check(manifest, tmp_path)
    assert len(errors) == 1
    assert "cannot compute" in errors[0] and "KeyError" in errors[0]


def write_table(root: Path, rows: str) -> Path:
    (root / "t.md").write_text(
        f"# T\n\n### Runs\n\n| name | speed | note |\n|---|---|---|\n{rows}\nafter\n"
    )
    (root / "r.json").write_text(json.dumps({"a": {"speed": 2.26}, "b": {"speed": 0.5}}))
    manifest = root / "figures.toml"
    manifest.write_text(
        '[paths]\nR = "r.json"\n\n[[table]]\ndoc = "t.md"\nafter = "### Runs"\n'
        'row = "get(R, cells[0])"\n'
        'columns = ["", "speed", "None if cells[0] == \'a\' else 100 * r[\'speed\']"]\n'
    )
    return manifest


def test_a_table_passes_cell_by_cell_reading_each_cells_leading_number(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    manifest = write_table(tmp_path, "| a | **2.26x** | - |\n| b | 0.50 (n = 3) | 50% |")
    assert cf.check(manifest, tmp_path) == []


def test_a_tampered_cell_fails_naming_its_row_and_column(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    manifest = write_table(tmp_path, "| a | 2.26 | - |\n| b | 0.52 | 50 |")
    errors = cf.check(manifest, tmp_path)
    assert len(errors) == 1
    assert "t.md: table after '### Runs': row 'b', column 'speed':" in errors[0]
    assert "does not round to 0.52" in errors[0]


def test_a_number_where_none_is_expected_and_a_short_row_fail(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    errors = cf.check(write_table(tmp_path, "| a | 2.26 | 7 |\n| b | 0.50 |"), tmp_path)
    assert len(errors) == 2
    assert "row 'a'" in errors[0] and "cell '7' against None" in errors[0]
    assert "row 'b' has 2 cells, the manifest 3" in errors[1]


def test_a_table_whose_heading_is_gone_fails(tmp_path: Path) -> None:
    cf = load_script("check_figures")
    manifest = write_table(tmp_path, "| a | 2.26 | - |")
    (tmp_path / "t.md").write_text("# T\n\nno table any more\n")
    assert cf.check(manifest, tmp_path) == [
        "t.md: table after '### Runs': no line holds '### Runs'"
    ]


def test_a_row_is_named_by_its_cells_before_the_first_number() -> None:
    cf = load_script("check_figures")
    assert cf.label(["swe_agent", "swing", "epic", "0.402", "x"]) == "swe_agent | swing | epic"
    assert cf.label(["2", "764", "594"]) == "2"
