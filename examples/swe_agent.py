"""A SWE-style tool loop on the embedded default model: THOUGHT + one shell command per step in
an offline workspace (in-memory files, a small shell, a test check). Prints every model call's
reuse (reused / recomputed tokens) and TTFT.

    agentcache installed:     python examples/swe_agent.py
    from a source checkout:   make setup && .venv/bin/python examples/swe_agent.py
"""

from __future__ import annotations

from collections.abc import Mapping

from agentcache_agents import SWEAgent, SWETask
from agentcache_agents.example import example_args, example_engine, print_run

FILES = {
    "README.md": "calc: a tiny calculator library.\n",
    "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}


def check(files: Mapping[str, str]) -> tuple[bool, str]:
    ok = "return a + b" in files.get("calc.py", "")
    return ok, "test_calc.py::test_add PASSED" if ok else "test_calc.py::test_add FAILED: -1 != 3"


TASK = SWETask("add(1, 2) returns -1 instead of 3. Fix add() in calc.py.", FILES, check, "calc.py")


def main() -> None:
    args = example_args(__doc__.splitlines()[0])
    agent = SWEAgent(example_engine(args), max_steps=6)
    result = agent.run(TASK)
    print_run("SWE-style agent", agent)
    for n, step in enumerate(result.trajectory, 1):
        command = step.action.split("```bash\n")[-1].removesuffix("\n```")
        print(f"step {n}: $ {command}  ->  {' '.join(step.observation.split())[:70]!r}")
    print(f"submitted: {result.submitted}; tests pass: {result.passed}; steps: {result.steps}")


if __name__ == "__main__":
    main()
