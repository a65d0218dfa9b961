from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from agentcache.model.loading import LoadedModel
from agentcache.runtime.engine import Engine, EngineConfig
from agentcache_agents import (
    AgentLoop,
    BlockSpec,
    MemGPTAgent,
    QATask,
    ReflexionAgent,
    SWEAgent,
    SWETask,
)
from tests.agents.scripted import script

PASSAGES = {
    "Analytical Engine": "The Analytical Engine was designed by Charles Babbage in 1837.",
    "Charles Babbage": "Charles Babbage was an English polymath. He was born in London.",
}
TASK = QATask("In which city was the designer of the Analytical Engine born?", "London", PASSAGES)


def engine(tiny: LoadedModel) -> Engine:
    return Engine(tiny, EngineConfig(kv_pages=1024))


def check(files: Mapping[str, str]) -> tuple[bool, str]:
    ok = "return a + b" in files["calc.py"]
    return ok, "1 passed" if ok else "FAILED test_add: add(1, 2) == -1"


SWE_TASK = SWETask(
    "add() in calc.py subtracts; make it add.",
    {"calc.py": "def add(a, b):\n    return a - b\n", "test_calc.py": "assert add(1, 2) == 3\n"},
    check,
    "calc.py",
)


def assert_counted(loop: AgentLoop) -> None:
    """Every replaced output is counted once and marked on its record."""
    assert loop.num_fallbacks == sum(r.fallback is not None for r in loop.records)
    assert sum(loop.fallbacks.values()) == loop.num_fallbacks


def test_reflexion_on_the_tiny_model_is_bounded_and_reuses(tiny: LoadedModel) -> None:
    agent = ReflexionAgent(engine(tiny), max_trials=2, max_steps=2, max_new_tokens=4)
    results = agent.run(TASK)
    assert [r.trial for r in results] == [1, 2] and not any(r.correct for r in results)
    assert [r.purpose for r in agent.records] == ["act", "act", "reflect", "act", "act"]
    assert agent.fallbacks["no action parsed"] == 4  # random bytes never hold an action
    assert_counted(agent)
    assert len(agent.reflections) == 1
    first, *later = agent.records
    assert first.reused_tokens == 0
    assert all(r.reused_tokens > 0 for r in later)
    for r in later:  # the system prompt and the question are found although they shift
        assert {m.segment_id for m in r.misses} <= {"reflections-header", "reflection-1"}


def test_reflexion_scripted_fails_reflects_then_solves(tiny: LoadedModel) -> None:
    agent = ReflexionAgent(engine(tiny), max_trials=3, max_steps=3, max_new_tokens=2)
    session = script(
        agent,
        [
            " I need the designer.\nAction 1: Search[Analytical Engine]",
            " It was Babbage.\nAction 2: Finish[Charles Babbage]",
            " I answered the designer instead of his birthplace; next time look up where he was born.",  # noqa: E501
            " Search the designer's birthplace.\nAction 1: Search[Charles Babbage]",
            " The passage says London.\nAction 2: Lookup[born]",
            " So the answer is London.\nAction 3: Finish[London]",
        ],
    )
    results = agent.run(TASK)
    answers = [(r.answer, r.correct) for r in results]
    assert answers == [("Charles Babbage", False), ("London", True)]
    assert agent.reflections == [
        "I answered the designer instead of his birthplace; next time look up where he was born."
    ]
    assert agent.num_fallbacks == 0 and not session.script
    last_prompt = session.prompt_for(agent._inputs(TASK, 2, []))
    texts = {s.id: s.text for s in last_prompt.segments}
    assert texts["reflection-1"].startswith("Reflection 1: I answered the designer")
    assert agent.records[-1].reused_tokens > 0


def test_memgpt_edits_core_memory_through_calls(tiny: LoadedModel) -> None:
    blocks = [BlockSpec("human", "Name: Ann", limit=60)]
    agent = MemGPTAgent(engine(tiny), blocks, max_queue_tokens=10_000, max_new_tokens=2)
    session = script(
        agent,
        [
            'Inner: a parrot!\ncore_memory_append(label="human", content="Parrot: Kiwi")',
            'send_message(message="Kiwi is a lovely name!")',
            'core_memory_replace(label="pets", old_content="x", new_content="y")',
            'core_memory_append(label="human", content="' + "z" * 80 + '")',
            'send_message(message="Noted.")',
        ],
    )
    assert agent.chat("I have a parrot called Kiwi") == "Kiwi is a lovely name!"
    assert agent.blocks["human"].value == "Name: Ann\nParrot: Kiwi"
    assert [m.role for m in agent.queue + agent.fresh] == ["user", "assistant", "tool", "assistant"]
    assert json.loads((agent.queue + agent.fresh)[2].content)["status"] == "OK"
    agent.max_heartbeats = 2
    assert agent.chat("anything else?") == "Noted."
    statuses = [
        json.loads(m.content)["status"] for m in agent.queue + agent.fresh if m.role == "tool"
    ]
    assert statuses[1].startswith("Error: no core memory block 'pets'")
    assert statuses[2].startswith("Error: block 'human' would hold")
    assert agent.blocks["human"].value == "Name: Ann\nParrot: Kiwi"  # over the limit: unchanged
    assert agent.num_fallbacks == 0 and not session.script
    assert all(r.reused_tokens > 0 for r in agent.records[1:])


def test_memgpt_on_the_tiny_model_summarises_on_overflow(tiny: LoadedModel) -> None:
    agent = MemGPTAgent(
        engine(tiny), [BlockSpec("persona", "I am Sam."), BlockSpec("human", "")],
        max_queue_tokens=250, max_heartbeats=1, max_new_tokens=4,
    )  # fmt: skip
    for text in ["hi, I am Ann", "I have a parrot", "I live in Oslo", "my parrot is Kiwi"]:
        agent.chat(text)
    purposes = [r.purpose for r in agent.records]
    assert purposes.count("reply") == 4  # random bytes: each burst ends in one fallback send
    assert agent.fallbacks["no function call parsed"] == 4
    assert_counted(agent)
    assert agent.num_summaries >= 1 and "summarise" in purposes
    assert agent.summary and agent.summary_upto == agent.queue[0].index > 0
    for r in agent.records[1:]:
        assert r.reused_tokens > 0
        assert all(m.segment_id.startswith("summary-") for m in r.misses if m.segment_id), r.misses
    after = agent.records[purposes.index("summarise") + 1 :]
    assert after and all(r.reused_tokens > 0 for r in after)  # kept messages found, shifted


def test_swe_on_the_tiny_model_follows_the_fallback_plan(tiny: LoadedModel) -> None:
    agent = SWEAgent(engine(tiny), max_steps=6, max_new_tokens=4)
    result = agent.run(SWE_TASK)
    assert result.submitted and not result.passed and result.steps == 4  # ls, cat, pytest, submit
    assert agent.fallbacks["no command parsed"] == 4
    assert_counted(agent)
    assert agent.records[0].reused_tokens == 0
    for r in agent.records[1:]:  # every earlier step is found, though the state before it changed
        assert r.reused_tokens > 0 and not r.misses


def test_swe_scripted_fixes_and_submits(tiny: LoadedModel) -> None:
    agent = SWEAgent(engine(tiny), max_steps=5, max_new_tokens=2)
    session = script(
        agent,
        [
            " The subtraction is the bug.\n```bash\nsed -i 's/a - b/a + b/' calc.py\n```",
            " Check it.\n```bash\npytest\n```",
            " Tests pass.\n```bash\nsubmit\n```",
        ],
    )
    result = agent.run(SWE_TASK)
    assert result.submitted and result.passed and result.steps == 3
    assert agent.num_fallbacks == 0 and not session.script


@pytest.mark.parametrize("steps", [1, 3])
def test_swe_stops_at_the_step_limit(tiny: LoadedModel, steps: int) -> None:
    agent = SWEAgent(engine(tiny), max_steps=steps, max_new_tokens=2)
    script(agent, ["```bash\nls\n```"] * steps)
    result = agent.run(SWE_TASK)
    assert result.steps == steps and not result.submitted and len(agent.records) == steps
