#!/usr/bin/env python3
"""Build benchmarks/workloads/templated.jsonl: sessions that name a shipped template
(reflexion, memgpt, swe_agent) and give each turn's inputs instead of segments.

Rebuild (from the repository root):  .venv/bin/python benchmarks/workloads/build_templated.py

Self-contained and deterministic: the texts are written here. Each session has 4 turns; the
static inputs are given once at session level, each turn gives what changed. Every turn ends
inside an open assistant message, mid-sentence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "templated.jsonl"
MAX_NEW_TOKENS = 32

EXAMPLES = [
    "Question: Which river flows through the capital of Austria?\n"
    "Thought 1: I need the capital of Austria, then its river.\n"
    "Action 1: Search[Austria]\nObservation 1: Austria is a country in Central Europe. Its "
    "capital is Vienna.\nThought 2: Now find the river of Vienna.\nAction 2: Search[Vienna]\n"
    "Observation 2: Vienna lies on the Danube.\nThought 3: The answer is the Danube.\n"
    "Action 3: Finish[Danube]",
    "Question: In what year was the author of 'The Origin of Species' born?\n"
    "Thought 1: The author is Charles Darwin; I need his birth year.\n"
    "Action 1: Search[Charles Darwin]\nObservation 1: Charles Darwin (12 February 1809 - 19 "
    "April 1882) was an English naturalist.\nThought 2: He was born in 1809.\n"
    "Action 2: Finish[1809]",
]
REFLEXION_STEPS = [
    (
        "Thought 1: I need the designer of the Analytical Engine.\n"
        "Action 1: Search[Analytical Engine]",
        "The Analytical Engine was a proposed mechanical general-purpose computer designed by "
        "the English mathematician Charles Babbage. It was first described in 1837.",
    ),
    (
        "Thought 2: The designer is Charles Babbage; I need his birthplace.\n"
        "Action 2: Search[Charles Babbage]",
        "Charles Babbage (26 December 1791 - 18 October 1871) was an English polymath. He was "
        "born at 44 Crosby Row, Walworth Road, London, England.",
    ),
    (
        "Thought 3: He was born in London.\nAction 3: Lookup[born]",
        "(Result 1 / 1) He was born at 44 Crosby Row, Walworth Road, London, England.",
    ),
]
REFLECTIONS = [
    "I answered with the designer's name, Charles Babbage, but the question asks for the city "
    "where the designer was born. Next time I will finish only after resolving the last hop.",
    "I ran out of steps because I searched for the whole question. I should search the "
    "Analytical Engine first, then its designer, then look up where he was born.",
]


def reflexion() -> dict[str, Any]:
    turns = []
    for t in range(4):  # trial 3: steps arrive one by one after two reflections
        steps = [{"action": a, "observation": o} for a, o in REFLEXION_STEPS[:t]]
        turns.append({
            "inputs": {
                "trial": 3, "steps_left": 6 - t, "scratchpad": steps[:-1],
                "latest": steps[-1] if steps else None, "reply_prefix": f"Thought {t + 1}: I",
            },
            "max_new_tokens": MAX_NEW_TOKENS,
        })  # fmt: skip
    return {
        "name": "templated-reflexion", "workload": "templated", "case": "shift",
        "template": "reflexion",
        "inputs": {
            "examples": EXAMPLES, "max_trials": 4, "reflections": REFLECTIONS,
            "question": "In which city was the designer of the Analytical Engine born?",
        },
        "turns": turns,
    }  # fmt: skip


CHAT = [
    ("user", "Hi! I'm Dana. I just moved to Lisbon for a new job at a bike-sharing startup."),
    ("assistant", 'send_message(message="Welcome to Lisbon, Dana! How is the new job going?")'),
    ("user", "Busy. I'm building their route planner. Also, I adopted a cat named Pixel."),
    ("assistant", 'core_memory_append(label="human", content="Has a cat named Pixel.")'),
    ("tool", '{"status": "OK", "time": "2026-01-05 09:04:00 AM"}'),
    ("assistant", 'send_message(message="A route planner and a cat named Pixel: big week!")'),
    ("user", "Ha, yes. Pixel keeps sitting on my keyboard while I debug the planner."),
    ("assistant", 'send_message(message="Pixel wants to help. What is the bug?")'),
    ("user", "The planner sends riders up the steepest hills. Any idea what to weigh?"),
]
HUMAN_FACTS = [
    "Name: Dana.",
    "Lives in Lisbon; works at a bike-sharing startup.",
    "Builds the startup's route planner.",
    "Has a cat named Pixel.",
]


def memgpt() -> dict[str, Any]:
    msgs = [{"index": i, "role": r, "content": c} for i, (r, c) in enumerate(CHAT)]
    msgs = [  # user messages as MemGPT user_message events
        {**m, "content": json.dumps({"type": "user_message", "message": m["content"]})}
        if m["role"] == "user" else m
        for m in msgs
    ]  # fmt: skip
    shown = [1, 3, 6, 9]  # messages visible at each turn: the new ones are updates
    turns = []
    for t, n in enumerate(shown):
        old = shown[t - 1] if t else 0
        human = "\n".join(HUMAN_FACTS[: 2 + t])
        turns.append({
            "inputs": {
                "last_modified": f"2026-01-05 09:{2 * n:02d}:00 AM", "recall_count": n,
                "archival_count": 3 + t,
                "blocks": [
                    {"label": "persona", "value": "I am Sam: curious, upbeat, brief.",
                     "description": "Who I am and how I speak."},
                    {"label": "human", "value": human, "description": "Facts about the user."},
                ],
                "history": msgs[:old], "new_messages": msgs[old:n],
                "reply_prefix": "Inner monologue: Dana",
            },
            "max_new_tokens": MAX_NEW_TOKENS,
        })  # fmt: skip
    return {"name": "templated-memgpt", "workload": "templated", "case": "swing",
            "template": "memgpt", "turns": turns}  # fmt: skip


SWE_STEPS = [
    (
        "THOUGHT: First I look at the repository layout.\n```bash\nls\n```",
        "README.md\nplanner\ntests",
    ),
    (
        "THOUGHT: The cost function is probably in the planner package.\n```bash\n"
        "grep -n slope planner/cost.py\n```",
        "12:    slope_penalty = 0.0  # TODO: hills\n13:    return distance + slope_penalty",
    ),
    (
        "THOUGHT: The slope penalty is zero; open the file.\n```bash\ncat planner/cost.py\n```",
        '   1  def edge_cost(distance, climb):\n   2      """Cost of riding one edge."""\n'
        "  12      slope_penalty = 0.0  # TODO: hills\n  13      return distance + slope_penalty",
    ),
]
SWE_TOOLS = [
    {"signature": "ls [DIR]", "docstring": "list a directory"},
    {"signature": "cat FILE", "docstring": "print a file with line numbers and open it"},
    {"signature": "grep PATTERN [FILE...]", "docstring": "print the lines that contain PATTERN"},
    {"signature": "sed -i 's/OLD/NEW/' FILE", "docstring": "replace OLD by NEW in FILE"},
    {"signature": "pytest", "docstring": "run the tests"},
    {"signature": "submit", "docstring": "finish the task"},
]


def swe_agent() -> dict[str, Any]:
    turns = []
    for t in range(4):
        steps = [{"action": a, "observation": o} for a, o in SWE_STEPS[:t]]
        turns.append({
            "inputs": {
                "cwd": "/repo" if t < 2 else "/repo/planner",
                "open_file": "planner/cost.py" if t == 3 else None, "steps_left": 10 - t,
                "history": steps[:-1], "latest": steps[-1] if steps else None,
                "reply_prefix": "THOUGHT: Next I",
            },
            "max_new_tokens": MAX_NEW_TOKENS,
        })  # fmt: skip
    task = (
        "The route planner sends riders up the steepest hills: edge_cost() in planner/cost.py "
        "ignores the climb. Make the cost grow with the climb so flat routes win."
    )
    return {"name": "templated-swe_agent", "workload": "templated", "case": "shift",
            "template": "swe_agent", "inputs": {"tools": SWE_TOOLS, "task": task},
            "turns": turns}  # fmt: skip


def main() -> None:
    sessions = [reflexion(), memgpt(), swe_agent()]
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)
    print(f"wrote {OUT} ({len(sessions)} sessions)")


if __name__ == "__main__":
    main()
