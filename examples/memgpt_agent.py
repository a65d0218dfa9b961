"""A MemGPT-style companion on the embedded default model: core memory edited through function
calls, a FIFO message queue, and a summary when the queue overflows. Prints every model call's
reuse (reused / recomputed tokens) and TTFT.

    agentcache installed:     python examples/memgpt_agent.py
    from a source checkout:   make setup && .venv/bin/python examples/memgpt_agent.py
"""

from __future__ import annotations

from agentcache_agents import BlockSpec, MemGPTAgent
from agentcache_agents.example import example_args, example_engine, print_run

USER = [
    "Hi! I'm Dana. I just moved to Lisbon for a job at a bike-sharing startup.",
    "I'm building their route planner. Also, I adopted a cat named Pixel.",
    "Pixel keeps sitting on my keyboard while I debug the planner.",
    "The planner sends riders up the steepest hills. What should it weigh?",
    "Good idea. By the way, what is my cat called?",
    "Thanks Sam, talk tomorrow!",
]


def main() -> None:
    args = example_args(__doc__.splitlines()[0])
    blocks = [
        BlockSpec("persona", "I am Sam: curious, upbeat and brief.", "Who I am."),
        BlockSpec("human", "", "Facts about the user.", limit=500),
    ]
    agent = MemGPTAgent(example_engine(args), blocks, max_queue_tokens=400)
    replies = [agent.chat(text) for text in USER]
    print_run("MemGPT-style agent", agent)
    for text, reply in zip(USER, replies, strict=True):
        print(f"user: {text}\n  sam: {reply}")
    print(f"core memory 'human': {agent.blocks['human'].value!r}")
    print(f"summaries: {agent.num_summaries}; queue starts at message {agent.summary_upto}")


if __name__ == "__main__":
    main()
