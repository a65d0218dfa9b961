"""Two turns of a SWE-style agent through agentcache's public API alone. The second turn's
state segment changes length and shifts everything after it (the task's history); the engine
reuses the shifted KV anyway. Prints each turn's reused and recomputed tokens and TTFT.

    agentcache installed:     python examples/quickstart.py
    from a source checkout:   make setup && .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import os

from agentcache import AgentSession, Engine, GenerationParams, load_model, load_template

TASK = "add(1, 2) returns -1 instead of 3. Fix add() in calc.py."
LS = {"action": "THOUGHT: see the files.\n```bash\nls\n```", "observation": "calc.py\ntest_calc.py"}
CAT = {"action": "THOUGHT: read it.\n```bash\ncat calc.py\n```", "observation": "return a - b"}
TURNS = [
    {"task": TASK, "steps_left": 9, "latest": LS, "reply_prefix": "THOUGHT:"},
    {"task": TASK, "steps_left": 8, "open_file": "/repo/calc.py", "history": [LS], "latest": CAT,
     "reply_prefix": "THOUGHT:"},
]  # fmt: skip


def main(engine: Engine | None = None) -> AgentSession:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the embedded model: nothing to download
    engine = engine or Engine(load_model())
    params = GenerationParams(max_new_tokens=24)
    session = AgentSession(engine, load_template("swe_agent"), params=params)
    for n, inputs in enumerate(TURNS, 1):
        s = session.turn(inputs).stats
        print(
            f"turn {n}: {s.prompt_tokens} prompt tokens, {s.reused_tokens} reused, "
            f"{s.recomputed_tokens} recomputed, first token after {s.ttft_s * 1000:.0f} ms"
        )
    return session


if __name__ == "__main__":
    main()
