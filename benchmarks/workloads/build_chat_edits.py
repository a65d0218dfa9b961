#!/usr/bin/env python3
"""Build the chat-path edit workloads: chat-sysprompt, chat-edit, chat-compact, chat-retry and
chat-fork (JSON Lines, one file per family, in the request format of chat.jsonl).

Rebuild (from the repository root):
  PYTHONPATH=. .venv/bin/python benchmarks/workloads/build_chat_edits.py

Each session is a bfcl-eval multi_turn_base case (its ground-truth calls, their results from
bfcl's own simulators, as build_workloads.py's chat tool-use sessions) sent the way a framework
that edits its history sends it: the family's edit (a changing system prompt, cleared tool
results, a compacted span, a retried turn, a subagent's requests between the parent's) is
applied to the request list. Each session declares the edits it makes (`"edits"`); the builder
checks every request against its thread's previous one with agentcache.workload.edits, runs
it through the server's segmenter, and enforces the sizes. No randomness, no network: two runs
write byte-identical files.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_workloads as bw

from agentcache.bench.reuse.edit_families import FAMILIES, Request, ToolConversation
from agentcache.workload.chat import chat_turns
from agentcache.workload.edits import check_edits

OUT_DIR = Path(__file__).resolve().parent
PER_HALF, MIN_TURNS, MIN_TOKENS, MAX_TOKENS = 4, 6, 1500, 4000
# cases that other workloads use (swe_agent, its demonstration, chat)
TAKEN = {*bw.SWE_CASES, bw.SWE_DEMO_CASE, *bw.CHAT_TOOL_CASES}
MIN_CALLS, MAX_TOOL_CHARS = 5, 19500  # a family needs 5-6 calls; more tool text leaves no room


@dataclass(frozen=True)
class BfclCase:
    cid: int
    case: dict[str, Any]
    truth: list[list[str]]
    under_specified: dict[int, str]  # user request index -> bfcl's miss_param phrasing

    @cached_property
    def conversation(self) -> ToolConversation:
        """The case as chat_tool_use builds it: one request before each ground-truth call."""
        from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

        bfcl = bw.pkg_dir("bfcl_eval", "bfcl-eval") / "data"
        docs = [
            d
            for cls in sorted(self.case["involved_classes"])
            for d in bw.read_jsonl(
                bfcl / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
            )
        ]
        params = {d["name"]: list(d["parameters"].get("properties", {})) for d in docs}
        body: list[dict[str, Any]] = []
        points, states, variants = [], [], {}
        steps = bw.replay_case(self.case, self.truth)
        for s, (u, call, obs, before) in enumerate(steps):
            if s == 0 or steps[s - 1][0] != u:
                if u in self.under_specified:
                    variants[len(body)] = self.under_specified[u]
                body.append({"role": "user", "content": self.case["question"][u][0]["content"]})
            points.append(len(body))
            states.append(before)
            body.append(
                {"role": "assistant", "content": "", "tool_calls": [bw.tool_call(call, s, params)]}
            )
            body.append({"role": "tool", "tool_call_id": f"call_{s}", "content": obs})
        tools = tuple(bw.openai_tool(d) for d in docs)
        return ToolConversation(
            bw.CHAT_TOOL_SYS, tools, tuple(body), tuple(points), tuple(states), variants
        )


def under_specified(base: list[Any], miss: list[Any]) -> dict[int, str]:
    """bfcl's miss_param set rewrites one request of a case without a parameter it needs: the
    first request whose text differs is that phrasing."""
    for u, (b, m) in enumerate(zip(base, miss, strict=False)):
        if m and b != m:
            return {u: m[0]["content"]}
    return {}


def load_cases(bfcl: Path) -> dict[str, list[BfclCase]]:
    """The usable multi_turn_base cases by id, alternately for tuning and validation."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    truth = {
        a["id"]: a["ground_truth"]
        for a in bw.read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json")
    }
    miss = {
        c["id"].rsplit("_", 1)[1]: c["question"]
        for c in bw.read_jsonl(bfcl / "BFCL_v4_multi_turn_miss_param.json")
    }
    doc_chars = {
        cls: len((bfcl / "multi_turn_func_doc" / f).read_text(encoding="utf-8"))
        for cls, f in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()
    }
    usable = []
    for case in bw.read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json"):
        cid = int(case["id"].rsplit("_", 1)[1])
        calls = sum(len(c) for c in truth[case["id"]])
        chars = sum(doc_chars[c] for c in case["involved_classes"])
        if cid not in TAKEN and calls >= MIN_CALLS and chars <= MAX_TOOL_CHARS:
            specified = under_specified(case["question"], miss[str(cid)])
            usable.append(BfclCase(cid, case, truth[case["id"]], specified))
    usable.sort(key=lambda c: c.cid)
    return {"tune": usable[0::2], "validate": usable[1::2]}


def session(
    family: str, idx: int, split: str, case: BfclCase, mode: str, requests: list[Request]
) -> dict[str, Any]:
    return {
        "name": f"{family}-{idx:02d}",
        "workload": family,
        "case": mode,
        "split": split,
        "source": f"bfcl multi_turn_base_{case.cid}",
        "edits": list(FAMILIES[family].edits),
        "turns": [r.to_json() for r in requests],
    }


def prompt_sizes(sess: dict[str, Any], count: Callable[[str], int]) -> list[int]:
    """Tokens per request, counted as build_workloads.check_chat counts them."""
    sizes = []
    for turn in sess["turns"]:
        texts = [m["content"] + json.dumps(m.get("tool_calls", "")) for m in turn["messages"]]
        tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in turn.get("tools", []))
        sizes.append(sum(count(t) + bw.ROLE_WRAP for t in texts) + count(tools))
    return sizes


def problem(sess: dict[str, Any], count: Callable[[str], int]) -> str | None:
    """Why a built session cannot be used (None: it can)."""
    turns = sess["turns"]
    if len(turns) < MIN_TURNS:
        return f"{len(turns)} turns"
    if any(t["messages"][-1]["role"] not in ("user", "tool") for t in turns):
        return "a request does not end where the model must answer"
    edits = check_edits(sess)
    kinds = {e.kind for e in edits}
    if not set(FAMILIES[sess["workload"]].edits) <= kinds:
        return f"edits {sorted(kinds)} lack {FAMILIES[sess['workload']].edits}"
    sizes = prompt_sizes(sess, count)
    if min(sizes) < MIN_TOKENS or max(sizes) > MAX_TOKENS:
        return f"prompts of {min(sizes)}-{max(sizes)} tokens"
    chat_turns(turns)  # raises on anything the server's segmenter rejects
    return None


def pick(family: str, pool: list[BfclCase], start: int) -> Iterator[BfclCase]:
    """The pool's cases from `start` on, cyclically."""
    for k in range(len(pool)):
        yield pool[(start + k) % len(pool)]


def build_family(
    family: str, pools: dict[str, list[BfclCase]], offset: int, count: Callable[[str], int]
) -> list[dict[str, Any]]:
    """PER_HALF sessions per split, modes alternating, each from the first case of the split's
    pool (from `offset` on) that the mode can use; a family uses a case once."""
    spec = FAMILIES[family]
    sessions: list[dict[str, Any]] = []
    for split, pool in pools.items():
        used: set[int] = set()
        for k in range(PER_HALF):
            mode = spec.modes[k % len(spec.modes)]
            idx = len(sessions)
            for case in pick(family, pool, offset):
                if case.cid in used or (requests := spec.make(case.conversation, mode)) is None:
                    continue
                sess = session(family, idx, split, case, mode, requests)
                if problem(sess, count) is None:
                    sessions.append(sess)
                    used.add(case.cid)
                    break
            else:
                sys.exit(f"error: {family} {split}: no case left for a {mode} session")
    return sessions


def summarize(family: str, sessions: list[dict[str, Any]], count: Callable[[str], int]) -> None:
    bw.check_halves(family, sessions)
    for half in ("tune", "validate"):
        for mode in FAMILIES[family].modes:
            mine = [s for s in sessions if (s["split"], s["case"]) == (half, mode)]
            sizes = [n for s in mine for n in prompt_sizes(s, count)]
            kinds = [e.kind for s in mine for e in check_edits(s)]
            edited = sum(k not in ("start", "append") for k in kinds)
            print(
                f"{family:<14} {half:<8} {mode:<9} {len(mine):>8} {len(sizes):>5} "
                f"{edited:>6} {min(sizes):>7} {int(statistics.median(sizes)):>6} "
                f"{max(sizes):>5}  {', '.join(s['source'].split('_')[-1] for s in mine)}"
            )


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    args = ap.parse_args()
    bfcl = bw.pkg_dir("bfcl_eval", "bfcl-eval") / "data"
    pools = load_cases(bfcl)
    count = bw.token_counter()
    print(
        f"{'family':<14} {'split':<8} {'case':<9} {'sessions':>8} {'turns':>5} {'edited':>6} "
        f"{'tok min':>7} {'median':>6} {'max':>5}  bfcl cases"
    )
    built = {}
    for offset, family in enumerate(FAMILIES):
        built[family] = build_family(family, pools, 3 * offset, count)
        summarize(family, built[family], count)
    args.out.mkdir(parents=True, exist_ok=True)
    for family, sessions in built.items():
        path = args.out / f"{family}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)
        print(f"wrote {path} ({len(sessions)} sessions)")


if __name__ == "__main__":
    main()
