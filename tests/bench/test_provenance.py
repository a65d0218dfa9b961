from __future__ import annotations

import platform
from pathlib import Path

import agentcache.reuse.strategies  # noqa: F401  (registers the strategies)
from agentcache.bench.provenance import (
    cpu_model,
    git_commit,
    load_average,
    provenance,
    resolved_spec,
    specs_of,
)
from agentcache.reuse.spec import StrategySpec


def test_a_spec_resolves_to_every_option_its_strategy_sets() -> None:
    rpdc = resolved_spec(StrategySpec.parse("rpdc"))
    assert rpdc.startswith("rpdc:cover=1.5:cover_min=256:epic_over=4:")
    assert "extra=0.2" in rpdc and "probe_layers=10" in rpdc and "selection=attention" in rpdc
    assert resolved_spec(StrategySpec.parse("default")) == rpdc
    assert resolved_spec(StrategySpec.parse("rpdc:cover_min=256")) == rpdc
    # the rule written without its floor has neither: the default before `cover_min=256`
    assert resolved_spec(StrategySpec.parse("rpdc:cover=1.5")) == rpdc.replace(
        "cover_min=256:epic_over=4:", ""
    )
    # without its thin-turn rule: the default before `epic_over=4`
    assert resolved_spec(StrategySpec.parse("rpdc:epic_over=0")) == rpdc.replace("epic_over=4:", "")
    assert "cover" not in resolved_spec(StrategySpec.parse("rpdc:cover=0"))
    assert resolved_spec(StrategySpec.parse("epic")) == "epic:boundary_k=64"
    assert resolved_spec(StrategySpec.parse("full")) == "full"


def test_a_record_names_commit_command_date_machine_specs_and_sessions() -> None:
    specs = specs_of(["full", "rpdc", "transformers-prefix", "rpdc"])
    record = provenance(specs, "validate", ["memgpt-08"], argv=["bench", "w.jsonl"])
    assert record["command"] == "agentcache bench w.jsonl"
    assert record["split"] == "validate" and record["sessions"] == ["memgpt-08"]
    assert list(record["specs"]) == ["full", "rpdc", "transformers-prefix"]
    assert record["specs"]["transformers-prefix"] == "transformers-prefix"
    assert {"cores", "cpu", "torch_threads", "torch"} <= set(record["machine"])
    assert record["date"].endswith("+00:00")


def test_outside_a_checkout_the_commit_is_unknown_not_made_up(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == (None, None)
    head, _ = git_commit()
    assert head is not None and len(head) == 40


def test_a_script_records_itself_as_the_command_and_the_load_to_two_decimals() -> None:
    record = provenance(argv=["--out", "o"], script="benchmarks/server/load.py")
    assert record["command"] == "python benchmarks/server/load.py --out o"
    assert provenance(argv=[], script="benchmarks/x.py")["command"] == "python benchmarks/x.py"
    loads = load_average()
    assert len(loads) == 3 and all(x >= 0 and round(x, 2) == x for x in loads)


def test_the_cpu_is_named_from_cpuinfo_or_said_unknown(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000\n\n")
    assert cpu_model(info) == "Test CPU 9000"
    assert cpu_model(tmp_path / "absent") in (platform.processor() or "unknown",)
