"""The check fails on each way a figure was found to claim more than its file: a ratio of
medians read as a median of ratios, runs paired across processes read as within one, an
earlier spec called the default, empty replies counted as identical, decode speed without its
set-up, a median over prompts read as every prompt, a tuning run quoted as validation."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench.scripts import BENCHMARKS, load_script

TODAY = "rpdc:cover=1.5:exact_prefix=true:extra=0.2"
BEFORE = "rpdc:exact_prefix=true:extra=0.2"


@pytest.fixture
def cf() -> ModuleType:
    return load_script("check_figures")


def bench(root: Path, name: str, data: dict[str, Any], **run: Any) -> str:
    path = root / "docs" / "bench" / name / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    rel = path.relative_to(root).as_posix()
    index = root / "docs" / "bench" / "runs.toml"
    head = "" if index.exists() else f'default = "{TODAY}"\n\n'
    lines = [f'[runs."{rel}"]', 'stored = "0000000 2026-12-01"', 'command = "agentcache bench"']
    for key, value in run.items():
        if isinstance(value, dict):
            pairs = ", ".join(f'"{k}" = "{v}"' for k, v in value.items())
            lines.append(f"{key} = {{ {pairs} }}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    with index.open("a") as f:
        f.write(head + "\n".join(lines) + "\n\n")
    return rel


def page(root: Path, text: str, doc: str = "docs/page.md") -> None:
    (root / doc).parent.mkdir(parents=True, exist_ok=True)
    (root / doc).write_text(f"# Page\n\n{text}\n")


def manifest(root: Path, *entries: str) -> Path:
    path = root / "figures.toml"
    path.write_text("\n".join(entries))
    return path


def figure(context: str, number: str, value: str, doc: str = "docs/page.md") -> str:
    return (
        f"[[figure]]\ndoc = {json.dumps(doc)}\ncontext = {json.dumps(context)}\n"
        f"figure = {json.dumps(number)}\nvalue = {json.dumps(value)}\n"
    )


def turns(ms: dict[str, list[float]], key: str = "strategy") -> list[dict[str, Any]]:
    """Warm turns 1..n of one session, each label's TTFT per turn."""
    return [
        {key: label, "session": "s", "turn": t + 1, "ttft_ms": v}
        for label, values in ms.items()
        for t, v in enumerate(values)
    ]


# medians 85 / 100 = 0.85; per turn 0.8, 0.7, 0.94, 1.0, 1.3: median 0.94
TTFT = {"rpdc": [40.0, 70.0, 85.0, 100.0, 130.0], "prefix": [50.0, 100.0, 90.0, 100.0, 100.0]}


def test_a_ratio_of_medians_is_not_the_median_of_per_turn_ratios(
    cf: ModuleType, tmp_path: Path
) -> None:
    r = bench(tmp_path, "v", {"turns": turns(TTFT), "split": "validate"}, specs={"rpdc": TODAY})
    ratio_of_medians = 85.0 / 100.0
    per_turn = sorted(a / b for a, b in zip(TTFT["rpdc"], TTFT["prefix"], strict=True))[2]
    assert (round(ratio_of_medians, 2), round(per_turn, 2)) == (0.85, 0.94)
    page(tmp_path, "On validation, TTFT vs prefix is 0.85x (median over turns of per-turn ratios).")
    as_median = figure("TTFT vs prefix is 0.85x", "0.85", f"median(vs('{r}', 'prefix', 'rpdc'))")
    errors = cf.check(manifest(tmp_path, as_median), tmp_path)
    assert len(errors) == 1 and "value 0.944" in errors[0] and "does not round to 0.85" in errors[0]
    by_medians = figure(
        "TTFT vs prefix is 0.85x",
        "0.85",
        f"ratio_of_medians(warm('{r}', 'rpdc', 'ttft_ms'), warm('{r}', 'prefix', 'ttft_ms'))",
    )
    errors = cf.check(manifest(tmp_path, by_medians), tmp_path)
    assert len(errors) == 1 and "is a ratio of medians; the sentence does not say so" in errors[0]
    page(tmp_path, "On validation, TTFT vs prefix is 0.85x (the ratio of medians).")
    assert cf.check(manifest(tmp_path, by_medians), tmp_path) == []


def test_configurations_run_in_separate_processes_are_not_paired_within_a_run(
    cf: ModuleType, tmp_path: Path
) -> None:
    records = turns({"pic": [50.0, 50.0], "prefix": [100.0, 90.0]}, key="config")
    r = bench(tmp_path, "vllm", {"records": records}, within_run=False, split="validate")
    value = f"median(vs('{r}', 'pic', 'prefix'))"
    page(tmp_path, "`pic` reaches its first token 1.90x sooner than prefix caching.")
    errors = cf.check(manifest(tmp_path, figure("token 1.90x sooner", "1.90", value)), tmp_path)
    assert len(errors) == 1 and "pairs configurations measured in separate runs" in errors[0]
    page(tmp_path, "`pic` reaches its first token 1.90x sooner (configurations in separate runs).")
    assert cf.check(manifest(tmp_path, figure("token 1.90x sooner", "1.90", value)), tmp_path) == []


def test_default_names_only_todays_resolved_default(cf: ModuleType, tmp_path: Path) -> None:
    data = {"turns": turns({"rpdc": [40.0, 40.0], "full": [100.0, 100.0]})}
    old = bench(tmp_path, "old", data, specs={"rpdc": BEFORE}, split="validate")
    new = bench(tmp_path, "new", data, specs={"rpdc": TODAY}, split="validate")
    page(tmp_path, "The default reaches its first token 2.50x sooner than full recompute.")

    def case(r: str) -> list[str]:
        fig = figure("token 2.50x sooner", "2.50", f"median(vs('{r}', 'rpdc', 'full'))")
        return list(cf.check(manifest(tmp_path, fig), tmp_path))

    errors = case(old)
    assert len(errors) == 1 and "says 'default', but measured full = full, rpdc = " in errors[0]
    assert f"rpdc = {BEFORE}; today's default is {TODAY}" in errors[0]
    assert case(new) == []


def reply(content: str | None, call: str | None = None) -> dict[str, Any]:
    calls = [{"id": "x", "function": {"name": call, "arguments": "{}"}}] if call else []
    return {"content": content, "tool_calls": calls}


def test_empty_replies_are_not_counted_as_identical(cf: ModuleType, tmp_path: Path) -> None:
    full = [reply("") for _ in range(19)] + [reply("hi"), reply(None, "f")] * 2 + [reply("x")]
    rpdc = [reply("") for _ in range(19)] + [reply("hi"), reply(None, "f")] * 2 + [reply("x")]
    data = {"replies": {"full": [full], "rpdc": [rpdc]},
            "summary": {"rpdc": {"turns": 24, "identical_to_full": 24}}}  # fmt: skip
    s = bench(tmp_path, "server", data, split="validate", specs={"rpdc": TODAY})
    page(tmp_path, "On the server path, 24 of 24 replies are identical to full recompute's.")
    stored = figure("24 of 24 replies", "24", f"get('{s}', 'summary', 'rpdc', 'identical_to_full')")
    errors = cf.check(manifest(tmp_path, stored), tmp_path)
    assert len(errors) == 1 and "counts empty replies as identical" in errors[0]
    pairs = f"replies('{s}', 'rpdc'), replies('{s}', 'full')"
    counted = figure("24 of 24 replies", "24", f"identical({pairs})")
    errors = cf.check(manifest(tmp_path, counted), tmp_path)
    assert len(errors) == 1 and "value 5 " in errors[0]
    page(tmp_path, "On the server path, 5 of 5 replies compared are identical (19 empty).")
    honest = [figure("5 of 5", "5", f"identical({pairs})"), figure("of 5 replies", "5",
              f"compared({pairs})"), figure("(19 empty", "19", f"empty({pairs})")]  # fmt: skip
    assert cf.check(manifest(tmp_path, *honest), tmp_path) == []


def decode_run() -> dict[str, Any]:
    """Two prompts: sparse steps 0.1 s against dense 0.2 s, 4 steps, sparse set-up 1 s."""
    prompt = {"policies": {"dense": {"step_s": [0.2] * 4, "setup_s": 0.0},
                           "sparse": {"step_s": [0.1] * 4, "setup_s": 1.0}}}  # fmt: skip
    return {"per_prompt": [prompt, prompt], "policies": {"sparse": {"speed_ratio_median": 2.0}}}


def test_a_decode_speed_without_its_set_up_must_say_so(cf: ModuleType, tmp_path: Path) -> None:
    d = bench(tmp_path, "decode", decode_run())
    page(tmp_path, "Sparse decode runs at 2.00x dense decode.")
    stored = figure(
        "at 2.00x dense", "2.00", f"get('{d}', 'policies', 'sparse', 'speed_ratio_median')"
    )
    errors = cf.check(manifest(tmp_path, stored), tmp_path)
    assert len(errors) == 1 and "without the decoder's set-up" in errors[0]
    with_setup = figure("at 2.00x dense", "2.00", f"median(decode_speed('{d}', 'sparse'))")
    errors = cf.check(manifest(tmp_path, with_setup), tmp_path)
    assert len(errors) == 1 and "value 0.571" in errors[0]  # 0.8 s / 1.4 s
    page(tmp_path, "Sparse decode runs at 2.00x dense decode in steady state (0.57x with set-up).")
    steady = figure("at 2.00x dense", "2.00", f"median(decode_speed('{d}', 'sparse', False))")
    setup = figure("(0.57x with", "0.57", f"median(decode_speed('{d}', 'sparse'))")
    assert cf.check(manifest(tmp_path, steady, setup), tmp_path) == []


def claim(context: str, holds: str) -> str:
    where = f"[[claim]]\ndoc = 'docs/page.md'\ncontext = {json.dumps(context)}\n"
    return where + f"holds = {json.dumps(holds)}\n"


def test_every_prompt_means_every_prompt_not_the_median(cf: ModuleType, tmp_path: Path) -> None:
    agreement = [1.0, 1.0, 0.4, 1.0]
    d = bench(tmp_path, "dense", {"per_prompt": [{"agree": a} for a in agreement],
                                  "summary": {"agree_median": 1.0}})  # fmt: skip
    page(tmp_path, "Dense decode gives the same greedy tokens on every prompt.")
    summary = claim(
        "same greedy tokens on every prompt", f"get('{d}', 'summary', 'agree_median') == 1"
    )
    errors = cf.check(manifest(tmp_path, summary), tmp_path)
    assert len(errors) == 1 and "says every/all, but is not every()" in errors[0]
    each = f"every([p['agree'] == 1 for p in get('{d}', 'per_prompt')])"
    errors = cf.check(
        manifest(tmp_path, claim("same greedy tokens on every prompt", each)), tmp_path
    )
    assert len(errors) == 1 and "is False, not True" in errors[0]
    bad = claim(
        "same greedy tokens on every prompt", f"every(get('{d}', 'summary', 'agree_median'))"
    )
    errors = cf.check(manifest(tmp_path, bad), tmp_path)
    assert len(errors) == 1 and "every() needs per-item values" in errors[0]


def test_a_tuning_run_is_not_a_validation_figure_nor_a_readme_one(
    cf: ModuleType, tmp_path: Path
) -> None:
    data = {"turns": turns({"rpdc": [40.0, 40.0], "full": [100.0, 100.0]})}
    r = bench(tmp_path, "tune", data, specs={"rpdc": TODAY}, split="tune")
    value = f"median(vs('{r}', 'rpdc', 'full'))"
    page(tmp_path, "On validation sessions `rpdc` reaches 2.50x.")
    errors = cf.check(manifest(tmp_path, figure("reaches 2.50x", "2.50", value)), tmp_path)
    assert len(errors) == 1 and "says 'validation', but reads" in errors[0]
    page(tmp_path, "`rpdc` reaches 2.50x.", doc="README.md")
    readme = figure("reaches 2.50x", "2.50", value, doc="README.md")
    errors = cf.check(manifest(tmp_path, readme), tmp_path)
    assert len(errors) == 1 and "it quotes validation runs only" in errors[0]


def test_the_archive_lists_every_results_file_and_shows_every_image(
    cf: ModuleType, tmp_path: Path
) -> None:
    bench(tmp_path, "a", {"turns": []})
    stray = tmp_path / "docs" / "bench" / "b" / "results.json"
    stray.parent.mkdir(parents=True)
    stray.write_text("{}")
    (tmp_path / "docs" / "bench" / "a" / "shown.png").write_bytes(b"")
    (tmp_path / "docs" / "bench" / "a" / "unseen.png").write_bytes(b"")
    page(tmp_path, "![plot](bench/a/shown.png)")
    assert cf.check(manifest(tmp_path), tmp_path) == [
        "docs/bench/b/results.json: not in docs/bench/runs.toml",
        "docs/bench/a/unseen.png: an image no page shows",
    ]


def test_the_index_default_is_the_registry_default_resolved() -> None:
    import tomllib

    import agentcache.reuse.strategies  # noqa: F401  (registers the strategies)
    from agentcache.bench.provenance import resolved_spec
    from agentcache.reuse.spec import DEFAULT_STRATEGY, StrategySpec

    root = Path(__file__).resolve().parents[2]
    index = tomllib.loads((root / "docs" / "bench" / "runs.toml").read_text())
    assert index["default"] == resolved_spec(StrategySpec.parse(DEFAULT_STRATEGY))


def test_a_sentence_is_its_table_row_or_the_prose_sentences_it_overlaps() -> None:
    rules = load_script("figure_rules")
    text = "Intro. The default is fast: 2.5x here.\nIt wraps. Next one.\n\n| a | 1 |\n| b | 2 |\n"
    assert rules.sentence_of(text, "2.5x here. It") == "The default is fast: 2.5x here. It wraps."
    assert rules.sentence_of(text, "| b | 2") == "| a | 1 | | b | 2 |"
    assert rules.sentence_of(text, "absent") == ""


def test_a_measured_ratio_no_entry_declares_fails_unless_marked_or_a_bound(
    cf: ModuleType, tmp_path: Path
) -> None:
    data = {"turns": turns({"rpdc": [40.0, 40.0], "full": [100.0, 100.0]})}
    r = bench(tmp_path, "v", data, specs={"rpdc": TODAY}, split="validate")
    declared = figure("reaches 2.50x", "2.50", f"median(vs('{r}', 'rpdc', 'full'))")
    page(tmp_path, "It reaches 2.50x, and 1.7x on the other.\n\nThe target is <= 0.8x `prefix`.")
    errors = cf.check(manifest(tmp_path, declared), tmp_path)
    assert len(errors) == 1 and errors[0].startswith("docs/page.md: 1.7x ")
    assert "a measured figure no entry declares" in errors[0]
    page(
        tmp_path,
        "It reaches 2.50x.\n\n## Profile\n\nNot reproduced: no stored results. It took 1.7x.",
    )
    assert cf.check(manifest(tmp_path, declared), tmp_path) == []


def test_the_listing_names_each_figures_runs_labels_and_sample(
    cf: ModuleType, tmp_path: Path
) -> None:
    data = {"turns": turns({"rpdc": [40.0, 50.0, 20.0], "full": [100.0, 100.0, 100.0]})}
    r = bench(tmp_path, "v", data, specs={"rpdc": TODAY}, split="validate")
    page(tmp_path, "It reaches 2.50x.")
    entry = figure("reaches 2.50x", "2.50", f"median(vs('{r}', 'rpdc', 'full'))")
    lines = cf.listing(manifest(tmp_path, entry), tmp_path)
    assert len(lines) == 1
    assert f"rpdc={TODAY}" in lines[0] and "full=full" in lines[0] and "\twithin\t" in lines[0]
    assert "median n=3 IQR 2.25-3.75" in lines[0]


def test_the_index_names_each_run_and_its_pages_and_fails_when_stale(
    cf: ModuleType, tmp_path: Path
) -> None:
    data = {"turns": turns({"rpdc": [40.0, 40.0], "full": [100.0, 100.0]})}
    r = bench(tmp_path, "v", data, specs={"rpdc": TODAY}, split="validate", what="a run")
    page(tmp_path, "It reaches 2.50x.")
    entry = figure("reaches 2.50x", "2.50", f"median(vs('{r}', 'rpdc', 'full'))")
    (tmp_path / "docs" / "bench" / "README.md").write_text("stale\n")
    errors = cf.check(manifest(tmp_path, entry), tmp_path)
    assert errors == [
        "docs/bench/README.md is out of date: python benchmarks/check_figures.py --index"
    ]
    index = load_script("figure_index").write_index(manifest(tmp_path, entry), tmp_path).read_text()
    assert "| `v/results.json` | a run | validate |" in index and "| docs/page.md |" in index
    assert cf.check(manifest(tmp_path, entry), tmp_path) == []


def test_a_results_file_with_its_provenance_needs_no_index_entry(
    cf: ModuleType, tmp_path: Path
) -> None:
    bench(tmp_path, "a", {"turns": []})
    made = {"commit": "c" * 40, "command": "agentcache bench w.jsonl", "split": "validate",
            "sessions": ["w-08"], "specs": {"rpdc": TODAY}}  # fmt: skip
    own = tmp_path / "docs" / "bench" / "b" / "results.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"turns": [], "provenance": made}))
    assert cf.check(manifest(tmp_path), tmp_path) == []
    run = load_script("figure_rules").load_index(tmp_path).runs["docs/bench/b/results.json"]
    assert (run.commit, run.split, run.spec("rpdc")) == ("c" * 40, "validate", TODAY)


def test_a_ratio_of_medians_from_two_runs_pairs_across_runs(cf: ModuleType, tmp_path: Path) -> None:
    a = bench(tmp_path, "a", {"turns": turns({"rpdc": [40.0, 60.0]})}, specs={"rpdc": TODAY})
    b = bench(tmp_path, "b", {"turns": turns({"epic": [100.0, 100.0]})})
    value = f"ratio_of_medians(warm('{a}', 'rpdc', 'ttft_ms'), warm('{b}', 'epic', 'ttft_ms'))"
    page(tmp_path, "`rpdc` takes 0.50x `epic`'s TTFT, the ratio of medians.")
    errors = cf.check(manifest(tmp_path, figure("0.50x `epic`'s", "0.50", value)), tmp_path)
    assert len(errors) == 1 and "measured in separate runs" in errors[0]
    page(tmp_path, "`rpdc` takes 0.50x `epic`'s TTFT, the ratio of medians of separate runs.")
    assert cf.check(manifest(tmp_path, figure("0.50x `epic`'s", "0.50", value)), tmp_path) == []


def test_the_index_names_where_a_moved_script_is_now(cf: ModuleType) -> None:
    index = load_script("figure_index")
    assert index.moved("python benchmarks/tiers_turns.py a --out b") == (
        " (now `benchmarks/tiers/turns.py`)"
    )
    assert index.moved("python benchmarks/tiers/turns.py a --out b") == ""
    assert index.moved("agentcache bench benchmarks/workloads/memgpt.jsonl") == ""
    for new in index.MOVED.values():
        assert (BENCHMARKS / new.removeprefix("benchmarks/")).is_file(), new


def test_previous_default_names_only_an_earlier_default(cf: ModuleType, tmp_path: Path) -> None:
    data = {"turns": turns({"rpdc": [40.0, 40.0], "full": [100.0, 100.0]})}
    old = bench(tmp_path, "old", data, specs={"rpdc": BEFORE}, split="validate")
    new = bench(tmp_path, "new", data, specs={"rpdc": TODAY}, split="validate")
    other = bench(tmp_path, "other", data, specs={"rpdc": "rpdc:ratio=0.3"}, split="validate")
    index = tmp_path / "docs" / "bench" / "runs.toml"
    index.write_text(f'previous = ["{BEFORE}"]\n' + index.read_text())
    page(tmp_path, "The previous default reaches its first token 2.50x sooner than full recompute.")

    def case(r: str) -> list[str]:
        fig = figure("token 2.50x sooner", "2.50", f"median(vs('{r}', 'rpdc', 'full'))")
        return list(cf.check(manifest(tmp_path, fig), tmp_path))

    assert case(old) == []
    errors = case(new)  # today's default is not a previous one
    assert len(errors) == 1 and "says 'previous default', but measured" in errors[0]
    assert f"the previous defaults are {BEFORE}" in errors[0]
    assert len(case(other)) == 1  # nor is a spec that was never the default
    page(tmp_path, "The default and the previous default reach it 2.50x sooner than full.")
    fig = figure("reach it 2.50x sooner", "2.50", f"median(vs('{new}', 'rpdc', 'full'))")
    assert cf.check(manifest(tmp_path, fig), tmp_path) == []  # a sentence naming both


def test_a_configuration_read_from_configs_is_held_to_its_label(
    cf: ModuleType, tmp_path: Path
) -> None:
    """The vLLM bench stores its summaries under `configs`: a figure read there names its
    configuration's resolved spec like a strategy's, so an earlier default's figure cannot be
    called the default."""

    def run(name: str, spec: str) -> str:
        data = {"configs": {"agentcache:rpdc": {"ttft_vs_prefix_paired_median": 1.16}}}
        return bench(tmp_path, name, data, specs={"agentcache:rpdc": spec}, split="validate")

    old, new = run("old", BEFORE), run("new", TODAY)
    page(tmp_path, "Inside vLLM the default took 1.16x prefix caching's TTFT.")

    def case(r: str) -> list[str]:
        value = f"get('{r}', 'configs', 'agentcache:rpdc', 'ttft_vs_prefix_paired_median')"
        return list(
            cf.check(manifest(tmp_path, figure("took 1.16x prefix", "1.16", value)), tmp_path)
        )

    errors = case(old)
    assert len(errors) == 1 and f"agentcache:rpdc = {BEFORE}; today's default is" in errors[0]
    assert case(new) == []
