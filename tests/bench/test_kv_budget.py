"""benchmarks/server/kv_budget.py: one pool for every policy, sparse turns counted by their
fast tier, ratios against dense within each repeat."""

from __future__ import annotations

from pathlib import Path

from agentcache.decode.profile import save_profile
from agentcache.model.loading import LoadedModel
from tests.bench.scripts import load_script
from tests.decode.conftest import TEXT, make_profile


def test_sparse_turns_run_more_at_once_in_the_same_pool(tiny: LoadedModel, tmp_path: Path) -> None:
    """Dense and a sparse policy on the same budget of two dense turns: dense runs at most
    two turns at once, flexicache more; verified decoding gives dense's ids; the summary's
    ratios are per repeat and the report renders them."""
    bench = load_script("server/kv_budget")
    profile = save_profile(make_profile(tiny), tmp_path / "profile.json")
    policies = ["dense", "flexicache:budget=2", "flexicache:budget=2:verify=4"]
    out = bench.measure(tiny, policies, profile, agents=5, context=400, new_tokens=12,
                        budget_turns=2, repeats=2, texts=[TEXT])  # fmt: skip
    runs = out["runs"]
    assert len(runs) == 6 and {r["policy"] for r in runs} == set(policies)
    assert [r["policy"] for r in runs[:3]] == policies  # rotated in the second repeat
    assert [r["policy"] for r in runs[3:]] == policies[1:] + policies[:1]
    s = out["summary"]
    assert s["dense"]["peak_running"] == [2, 2]
    assert min(s["flexicache:budget=2"]["peak_running"]) > 2
    assert s["flexicache:budget=2"]["fast_tier_bytes_per_turn"] > 0
    verified = s["flexicache:budget=2:verify=4"]
    assert verified["equal_dense"] == verified["compared"] == 10
    assert s["dense"]["over_dense"] == [1.0, 1.0]
    dense = {r["repeat"]: r["tokens_per_s"] for r in runs if r["policy"] == "dense"}
    want = [r["tokens_per_s"] / dense[r["repeat"]] for r in runs if r["policy"] == policies[1]]
    assert s[policies[1]]["over_dense"] == want
    assert all(r["tokens"] == 5 * 12 for r in runs)
    # verified decoding's counts: every token decoded came from a round's drafts and passes
    assert verified["decoded"] == 2 * 5 * 11 and verified["passes"] > 0
    assert verified["accepted"] <= verified["drafted"]
    assert verified["decoded"] <= verified["drafted"] + verified["passes"]
    assert s["dense"]["passes"] == s["dense"]["drafted"] == 0
    meta = {"provenance": {"command": "c", "commit": "x", "date": "d",
                           "machine": {"cores": 2, "torch_threads": 1}},
            "settings": {"model": "m", "agents": 5, "new_tokens": 12, "budget_turns": 2,
                         "repeats": 2}}  # fmt: skip
    text = bench.report({**out, **meta})
    assert "| `flexicache:budget=2` |" in text and "10 of 10" in text
    rows = (verified["drafted"] + verified["passes"]) / verified["decoded"]
    assert f"| `flexicache:budget=2:verify=4` | {verified['decoded']} |" in text
    assert f"| {rows:.3f} |" in text and "| `dense` | 0 |" not in text
    # where each run's time went: the parts of each policy's steps, and the report's table
    for r in runs:
        assert r["prefill_s"] > 0 and r["step_seconds"]["rest"] > 0
    assert s["dense"]["time_s"]["attention:dense"] > 0
    assert s["dense"]["time_s"]["attention:sparse"] == s["dense"]["time_s"]["attention:verify"] == 0
    assert verified["time_s"]["attention:verify"] > 0 and verified["time_s"]["attention:sparse"] > 0
    assert f"| `dense` | {s['dense']['time_s']['wall']:.2f} |" in text
    assert "time_split.png" in text


def test_render_writes_the_report_and_plot_again(tiny: LoadedModel, tmp_path: Path) -> None:
    """`--render` runs nothing: report.md and the plot from a stored results.json."""
    import json
    import sys

    bench = load_script("server/kv_budget")
    out = bench.measure(tiny, ["dense"], None, agents=2, context=200, new_tokens=4,
                        budget_turns=2, repeats=1, texts=[TEXT])  # fmt: skip
    meta = {"provenance": {"command": "c", "commit": "x", "date": "d",
                           "machine": {"cores": 2, "torch_threads": 1}},
            "settings": {"model": "m", "agents": 2, "new_tokens": 4, "budget_turns": 2,
                         "repeats": 1}}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({**out, **meta}))
    argv = sys.argv
    sys.argv = ["kv_budget.py", "--out", str(tmp_path), "--render"]
    try:
        bench.main()
    finally:
        sys.argv = argv
    assert "| `dense` |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "time_split.png").stat().st_size > 0
    # results from before the split render without its table or plot
    older = {**out, **meta, "summary": {"dense": {k: v for k, v in out["summary"]["dense"].items()
                                                  if k != "time_s"}}}  # fmt: skip
    assert "time_split.png" not in bench.render(older, tmp_path / "older")
    assert not (tmp_path / "older" / "time_split.png").exists()
