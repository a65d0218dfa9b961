from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from agentcache.model.loading import LoadedModel
from tests.bench.scripts import load_script

et = load_script("reuse/exact_turns")

SIZE = 500  # bytes on the tiny model's byte tokenizer: one or two tools per block


def run(tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> Any:
    monkeypatch.setattr(et, "load_model", lambda: tiny)
    et.main([*argv, "--size", str(SIZE), "--reps", "2", "--out", str(tmp_path)])
    return json.loads((tmp_path / "results.json").read_text())


def by_strategy(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["rep"]):
        out[(r["scenario"], r["case"], r["strategy"])].append(r)
    return out


def test_server_path_repetitions_meet_the_same_store_state(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = run(tiny, tmp_path, monkeypatch, "--path", "server", "--scenarios", "miss,fresh",
                  "--miss-strategies", "full,prefix,rpdc",
                  "--hits", "system,system+tools,history")  # fmt: skip
    groups = by_strategy(results["rows"])
    assert len(groups) == 3 + 3 * 2 and all(len(reps) == 2 for reps in groups.values())
    for (scen, case, label), (r0, r1) in groups.items():
        assert r0["path"] == "server"
        for k in ("model_calls", "reused_tokens", "loaded_tokens"):
            assert r0[k] == r1[k], (scen, case, label, k)
        if case in ("system+tools", "history"):  # the same prompt size: the same work
            assert r0["prompt_tokens"] == r1["prompt_tokens"]
            assert r0["recomputed_tokens"] == r1["recomputed_tokens"]
    first_block = groups[("miss", "no-reuse", "prefix")][0]["loaded_tokens"]
    assert 0 < first_block <= 64  # the blocks before the stamp's minute
    for r in groups[("miss", "no-reuse", "full")]:
        assert r["loaded_tokens"] == 0 and r["recomputed_tokens"] == r["prompt_tokens"]
    for r in groups[("miss", "no-reuse", "rpdc")]:  # the system message's head, before the stamp
        assert first_block <= r["loaded_tokens"] <= 64
        assert r["recomputed_tokens"] == r["prompt_tokens"] - r["loaded_tokens"]
    for case in ("system", "system+tools", "history"):
        for r in groups[("fresh", case, "rpdc")]:
            assert 0 < r["loaded_tokens"] < r["prompt_tokens"]  # a hit, not a full one
    # the requests of one repetition are the same text for both strategies
    for (_, case, _), reps in groups.items():
        other = groups[(reps[0]["scenario"], case, "prefix")]
        assert [r["prompt_tokens"] for r in reps] == [r["prompt_tokens"] for r in other]
    summary = {(s["scenario"], s["case"]): s for s in results["summary"] if "n" in s}
    assert summary[("fresh", "history")]["n"] == 2
    assert "Path: `server`" in (tmp_path / "report.md").read_text()


def test_engine_path_repeats_the_same_request(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = run(tiny, tmp_path, monkeypatch, "--scenarios", "fresh", "--hits", "system+tools")
    (r0, r1), (p0, p1) = by_strategy(results["rows"]).values()
    assert r0["path"] == "engine" and r0["prompt_tokens"] == p0["prompt_tokens"]
    keys = ("prompt_tokens", "model_calls", "loaded_tokens", "recomputed_tokens")
    assert [r0[k] for k in keys] == [r1[k] for k in keys]
    assert [p0[k] for k in keys] == [p1[k] for k in keys]
    assert "Path: `engine`" in (tmp_path / "report.md").read_text()


def test_server_variants_differ_only_where_the_case_says() -> None:
    class Tok:
        def encode(self, text: str) -> list[int]:
            return list(text.encode())

    class Model:
        tokenizer = Tok()

    tools = et.bfcl_tools()
    reqs = {r.case: r for r in et.requests(SIZE, 1, Model(), tools) if r.case != "setup"}
    v = et.Variants(Model(), tools, SIZE)
    names = [b[0].name[0] for b in v.blocks]
    assert len(set(names)) == len(names) == et.VARIANTS and tools[0].name[0] not in names
    for k in (1, 2):
        hit = v.hit(reqs["system+tools"], k)
        assert (
            hit.tools == reqs["system+tools"].tools
            and hit.messages[0] == reqs["system"].messages[0]
        )
        assert hit.messages[-1].content.startswith(f"{k}) ")
        system = v.hit(reqs["system"], k)
        assert (
            system.tools != reqs["system+tools"].tools and system.messages[:-1] == hit.messages[:-1]
        )
        history = v.hit(reqs["history"], k)
        assert history.messages[:2] == reqs["history"].messages[:2]
        assert history.messages[2] != reqs["history"].messages[2]
    misses = [v.miss(k) for k in range(3)]
    assert len({m.messages[0].content for m in misses}) == 3
    assert len({tuple(t.name for t in m.tools) for m in misses}) == 3
