from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agentcache.errors import AgentCacheError, PromptError
from agentcache.kv.store import content_id
from agentcache.model.loading import LoadedModel
from agentcache.model.tokenizer import CHATML
from agentcache.prompt.registry import TEMPLATES, load_template
from agentcache.prompt.segments import SegmentKind
from agentcache.prompt.template import PromptTemplate
from agentcache.prompt.tokenize import TokenizedPrompt
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from agentcache.runtime.stats import TokenUse

REUSED = (TokenUse.EXACT, TokenUse.MOVED, TokenUse.REFRESHED)

STEP_1 = {"action": "Thought 1: look it up.\nAction 1: Search[Ada Lovelace]", "observation": "a"}
STEP_2 = {"action": "Thought 2: check the year.\nAction 2: Lookup[born]", "observation": "1815"}


def turns(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two consecutive turns: the second changes the update inputs and moves the first turn's
    newest item into the fixed history."""
    if name == "reflexion":
        base = {"question": "When was Ada Lovelace born?", "reflections": ["Search first."]}
        a = {**base, "trial": 2, "steps_left": 5, "latest": STEP_1, "reply_prefix": "Thought 2:"}
        b = {**base, "trial": 2, "steps_left": 4, "scratchpad": [STEP_1], "latest": STEP_2}
        return a, {**b, "reply_prefix": "Thought 3:"}
    if name == "memgpt":
        hi = {"index": 0, "role": "user", "content": '{"message": "hi, I am Ann"}'}
        yo = {"index": 1, "role": "assistant", "content": 'send_message(message="Hi Ann!")'}
        pet = {"index": 2, "role": "user", "content": '{"message": "I have a parrot"}'}
        block = {"label": "human", "value": "Name: Ann", "limit": 100}
        a = {"last_modified": "t0", "blocks": [block], "new_messages": [hi]}
        grown = {**block, "value": "Name: Ann\nHas a parrot"}
        b = {"last_modified": "t1", "recall_count": 2, "blocks": [grown]}
        return a, {**b, "history": [hi], "new_messages": [yo, pet]}
    tools = [{"signature": "ls", "docstring": "list"}]
    swe = {"task": "Make add() in calc.py return a + b.", "tools": tools}
    a = {**swe, "steps_left": 9, "latest": STEP_1}
    b = {**swe, "cwd": "/repo/src", "open_file": "calc.py", "steps_left": 8}
    return a, {**b, "history": [STEP_1], "latest": STEP_2}


def keys(prompt: TokenizedPrompt) -> dict[str, str]:
    """Segment id -> content key (token ids hashed as the store keys them)."""
    return {s.segment.id or "": content_id(s.ids, "segment", None) for s in prompt.segments}


@pytest.mark.parametrize("name", ["reflexion", "memgpt", "swe_agent"])
def test_template_renders_and_runs_on_the_tiny_model(tiny: LoadedModel, name: str) -> None:
    assert tiny.chat_format == CHATML  # the default model's chat format
    engine = Engine(tiny, EngineConfig(kv_pages=512))
    prompt = load_template(name).render(turns(name)[0])
    kinds = {s.kind for s in prompt.segments}
    assert kinds == {SegmentKind.SYSTEM, SegmentKind.UPDATE} | (
        {SegmentKind.FIXED} if name != "memgpt" else set()
    )
    assert prompt.segments[0].kind == SegmentKind.SYSTEM and prompt.segments[0].id == "sys"
    tokens = engine.tokenize(prompt)
    head = CHATML.wrap("system", "").encode()[: -len(CHATML.end)]
    assert tokens.ids[: len(head)] == tuple(head)
    out = engine.generate(tokens, GenerationParams(max_new_tokens=3))
    assert out.stats.prompt_tokens == tokens.num_tokens and len(out.token_ids) <= 3


@pytest.mark.parametrize("name", ["reflexion", "memgpt", "swe_agent"])
def test_fixed_keys_stable_when_update_inputs_change(tiny: LoadedModel, name: str) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=512))
    template = load_template(name)
    first, second = (engine.tokenize(template.render(t)) for t in turns(name))
    k1, k2 = keys(first), keys(second)
    kinds1 = {s.segment.id: s.kind for s in first.segments}
    kinds2 = {s.segment.id: s.kind for s in second.segments}
    fixed = [i for i, k in kinds2.items() if k == SegmentKind.FIXED]
    assert fixed
    for sid in fixed:  # every fixed segment was in the first turn, with the same key
        assert k2[sid] == k1[sid], sid
    moved = [i for i in fixed if kinds1[i] == SegmentKind.UPDATE]
    assert moved, "an update of the first turn becomes fixed in the second"
    assert k1["sys"] == k2["sys"]
    changed_updates = [
        i for i, k in kinds2.items() if k == SegmentKind.UPDATE and i in k1 and k1[i] != k2[i]
    ]
    assert changed_updates  # the update inputs really changed
    # and the engine finds them: the second turn reuses the system and fixed segments
    engine.generate(first, GenerationParams(max_new_tokens=2))
    out = engine.generate(second, GenerationParams(max_new_tokens=2))
    reusable = sum(len(s.ids) for s in second.segments if s.kind != SegmentKind.UPDATE)
    # and of an update, at most its opening: what it shares with the segment stored after the
    # same context (its head), loaded exactly
    uses = out.stats.token_reuse
    assert uses is not None
    opened = 0
    for s in second.segments:
        if s.kind == SegmentKind.UPDATE:
            n = sum(uses.count(u, s.start, s.end) for u in REUSED)
            assert uses.count(TokenUse.EXACT, s.start, s.start + n) == n, s.segment.id
            opened += n
    assert out.stats.reused_tokens == reusable + opened
    assert not out.stats.misses


def test_fixed_keys_unchanged_when_only_updates_change(tiny: LoadedModel) -> None:
    engine = Engine(tiny, EngineConfig(kv_pages=64))
    t = load_template("swe_agent")
    base = turns("swe_agent")[1]
    a = engine.tokenize(t.render(base))
    b = engine.tokenize(t.render({**base, "steps_left": 2, "cwd": "/", "reply_prefix": "THOUGHT:"}))
    fixed_a = [s.ids for s in a.segments if s.kind != SegmentKind.UPDATE]
    fixed_b = [s.ids for s in b.segments if s.kind != SegmentKind.UPDATE]
    assert fixed_a == fixed_b
    assert [s.start for s in a.segments] != [s.start for s in b.segments]  # shifted, same keys


@pytest.mark.parametrize(
    ("name", "bad", "field"),
    [
        ("reflexion", {"question": ""}, "question"),
        ("reflexion", {"question": "q", "trial": 0}, "trial"),
        ("reflexion", {"question": "q", "scratchpad": [{"action": "a"}]}, "observation"),
        ("reflexion", {"question": "q", "qestion": "typo"}, "qestion"),
        ("memgpt", {"last_modified": "t", "blocks": []}, "blocks"),
        (
            "memgpt",
            {"last_modified": "t", "blocks": [{"label": "Bad Label", "value": ""}]},
            "label",
        ),
        ("memgpt", {"blocks": [{"label": "human", "value": "x"}]}, "last_modified"),
        ("swe_agent", {"task": "t", "steps_left": -1}, "steps_left"),
        ("swe_agent", {"tools": []}, "task"),
    ],
)
def test_wrong_inputs_name_the_field(name: str, bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_template(name).render(bad)
    assert field in str(e.value)


def test_cross_field_rules_are_validation_errors() -> None:
    t = load_template("memgpt")
    block = {"label": "human", "value": "x" * 11, "limit": 10}
    with pytest.raises(ValidationError, match="over its limit of 10"):
        t.render({"last_modified": "t", "blocks": [block]})
    msgs = [
        {"index": 3, "role": "user", "content": "a"},
        {"index": 2, "role": "user", "content": "b"},
    ]
    with pytest.raises(ValidationError, match=r"indices must increase"):
        t.render({"last_modified": "t", "blocks": [{"label": "h", "value": ""}], "history": msgs})
    with pytest.raises(ValidationError, match="past max_trials"):
        load_template("reflexion").render({"question": "q", "trial": 4, "max_trials": 3})


def test_malformed_template_is_a_prompt_error() -> None:
    source = TEMPLATES.get("memgpt").text().replace("{% endsegment %}", "", 1)
    with pytest.raises(PromptError, match=r"'memgpt-broken' line \d+"):
        PromptTemplate(source, TEMPLATES.get("memgpt").inputs, name="memgpt-broken")
    stray = (
        TEMPLATES.get("swe_agent")
        .text()
        .replace('{% segment "fixed", id="instance"', 'oops {% segment "fixed", id="instance"')
    )
    with pytest.raises(PromptError, match="outside any segment: 'oops'"):
        PromptTemplate(stray, TEMPLATES.get("swe_agent").inputs, name="x").render({"task": "t"})


def test_unknown_template_lists_the_known_ones() -> None:
    with pytest.raises(AgentCacheError, match=r"unknown template 'reflection'; known: memgpt"):
        load_template("reflection")
    assert TEMPLATES.names() == ["memgpt", "reflexion", "swe_agent"]
