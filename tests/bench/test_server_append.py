from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_script

sa = load_script("server/append")


def test_a_case_named_in_any_workload_file_is_taken(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"source": "bfcl multi_turn_base_177"}\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text('{"x": "multi_turn_base_151 and more"}')
    (tmp_path / "c.txt").write_text("multi_turn_base_150")  # not a workload file
    taken = sa.taken_cases((tmp_path,))
    assert {177, 151} <= taken and 150 not in taken
    assert set(sa.bw.CHAT_TOOL_CASES) <= taken and sa.bw.SWE_DEMO_CASE in taken


def test_the_conversations_are_in_no_workload_file_and_only_append() -> None:
    bfcl = sa.bw.pkg_dir("bfcl_eval", "bfcl-eval") / "data"
    taken = sa.taken_cases()
    assert {83, 105, 16} <= taken  # named by the chat edit families' files
    cids = sa.pick_cases(bfcl, 4, 6, taken)
    assert len(set(cids)) == 4 and not set(cids) & taken
    for cid in cids:
        conv = sa.conversation(bfcl, cid, 6)
        steps = conv["steps"]
        assert len(steps) == 6 and conv["tools"]
        for prev, cur in itertools.pairwise(steps):
            assert cur[: len(prev)] == prev and len(cur) > len(prev)
            assert cur[len(prev)]["role"] == "assistant" and cur[-1]["role"] in ("user", "tool")


def test_the_order_alternates_per_step() -> None:
    labels = ["default", "prefix", "full"]
    assert sa.order(0, labels) == labels and sa.order(1, labels) == labels[::-1]
    firsts = [sa.order(s, labels).index("default") < sa.order(s, labels).index("prefix")
              for s in range(4)]  # fmt: skip
    assert firsts == [True, False, True, False]


def record(session: str, turn: int, label: str, ttft: float, latency: float) -> dict[str, Any]:
    return {"session": session, "turn": turn, "strategy": label, "ttft_ms": ttft,
            "latency_ms": latency, "other_ms": latency - ttft, "prompt_tokens": 100,
            "cached_tokens": 90 if turn else 0, "finish_reason": "tool_calls"}  # fmt: skip


def reply(text: str | None, call: str | None = None) -> dict[str, Any]:
    calls = [{"function": {"name": call, "arguments": "{}"}}] if call else []
    return {"content": text, "tool_calls": calls}


def test_ratios_pair_the_same_step_and_leave_out_each_conversations_first() -> None:
    # prefix's records come in another order than default's: pairing is by (session, turn)
    turns = [
        record("a", 1, "prefix", 100, 1000), record("a", 0, "prefix", 900, 2000),
        record("b", 1, "prefix", 50, 400),
        record("a", 0, "default", 9000, 9000), record("a", 1, "default", 110, 1100),
        record("b", 1, "default", 100, 400),
    ]  # fmt: skip
    assert sa.paired(turns, "default", "prefix", "ttft_ms") == [1.1, 2.0]
    assert sa.paired(turns, "default", "prefix", "latency_ms") == [1.1, 1.0]
    replies = {"default": [[reply(None, "ls"), reply("x")], [reply("")]],
               "prefix": [[reply(None, "ls"), reply("y")], [reply("")]]}  # fmt: skip
    s = sa.summarize(turns, replies, ["default", "prefix"])
    lat = s["default_vs_prefix"]["latency"]
    assert lat["n"] == 2 and lat["median"] == pytest.approx(1.05)
    assert (lat["min"], lat["max"]) == (1.0, 1.1)
    assert s["target"]["latency_met"] is False  # 1.05 > 1.02
    # the empty pair is not compared, the differing text is not identical
    assert s["default_vs_prefix"]["replies"] == {"steps": 3, "compared": 2, "identical": 1,
                                                 "empty": 1, "differing": [1]}  # fmt: skip


def test_a_reply_differing_only_in_its_calls_arguments_is_not_identical() -> None:
    a = {"content": None, "tool_calls": [{"function": {"name": "cd", "arguments": '{"f": 1}'}}]}
    b = {"content": None, "tool_calls": [{"function": {"name": "cd", "arguments": '{"f": 2}'}}]}
    assert sa.reply_key(a) != sa.reply_key(b) and sa.reply_key(a) == sa.reply_key(dict(a))


@pytest.mark.slow
def test_a_short_run_writes_paired_steps_and_identical_replies(tmp_path: Path) -> None:
    """Two real servers (default, prefix) on one conversation of two steps."""
    argv = ["--conversations", "1", "--steps", "2", "--max-tokens", "16", "--no-full",
            "--out", str(tmp_path)]  # fmt: skip
    assert sa.main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["provenance"]["specs"]["prefix"] == "prefix"
    reported = data["provenance"]["reported_strategies"]["default"]
    assert data["provenance"]["specs"]["default"].startswith(reported)
    assert len(data["turns"]) == 4 and data["summary"]["default_vs_prefix"]["latency"]["n"] == 1
    warm = [r for r in data["turns"] if r["turn"] == 1]
    assert all(r["cached_tokens"] > 0 for r in warm)
    rep = data["summary"]["default_vs_prefix"]["replies"]
    assert rep["identical"] == rep["compared"]  # append-only: the default reuses exactly
    assert (tmp_path / "report.md").exists() and (tmp_path / "ratios.png").exists()
