"""A Reflexion agent answering a two-hop question over an offline knowledge base, on the
embedded default model. Prints every model call's reuse (reused / recomputed tokens) and TTFT.

    agentcache installed:     python examples/reflexion_agent.py
    from a source checkout:   make setup && .venv/bin/python examples/reflexion_agent.py
"""

from __future__ import annotations

from agentcache_agents import QATask, ReflexionAgent
from agentcache_agents.example import example_args, example_engine, print_run

EXAMPLES = [
    "Question: Which river flows through the capital of Austria?\n"
    "Thought 1: I need the capital of Austria, then its river.\n"
    "Action 1: Search[Austria]\n"
    "Observation 1: Austria is a country in Central Europe. Its capital is Vienna.\n"
    "Thought 2: Now I need the river of Vienna.\n"
    "Action 2: Search[Vienna]\n"
    "Observation 2: Vienna is the capital of Austria. It lies on the Danube.\n"
    "Thought 3: The river is the Danube.\n"
    "Action 3: Finish[Danube]",
]
PASSAGES = {
    "Analytical Engine": "The Analytical Engine was a proposed mechanical general-purpose "
    "computer designed by the English mathematician Charles Babbage. It was first described "
    "in 1837.",
    "Charles Babbage": "Charles Babbage (1791-1871) was an English polymath who originated the "
    "concept of a digital programmable computer. He was born in London.",
    "Ada Lovelace": "Ada Lovelace (1815-1852) was an English mathematician who wrote the first "
    "program for the Analytical Engine.",
    "London": "London is the capital of England and the United Kingdom.",
}
TASK = QATask("In which city was the designer of the Analytical Engine born?", "London", PASSAGES)


def main() -> None:
    args = example_args(__doc__.splitlines()[0])
    agent = ReflexionAgent(example_engine(args), EXAMPLES, max_trials=3, max_steps=4)
    results = agent.run(TASK)
    print_run("Reflexion", agent)
    for r in results:
        print(f"trial {r.trial}: answer {r.answer!r} ({'correct' if r.correct else 'wrong'}), "
              f"{r.steps} steps")  # fmt: skip
    for i, text in enumerate(agent.reflections, 1):
        print(f"reflection {i}: {text}")


if __name__ == "__main__":
    main()
