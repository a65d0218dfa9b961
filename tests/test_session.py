from __future__ import annotations

import threading

import pytest
from pydantic import BaseModel

from agentcache.errors import ConfigError, PromptError, UnknownStrategyError
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.prompt.template import PromptTemplate
from agentcache.runtime.engine import Engine, EngineConfig, Generation, GenerationParams
from agentcache.session import AgentSession


class TurnInputs(BaseModel):
    persona: str
    history: list[str] = []
    observation: str


TEMPLATE = """
{% segment "system", id="sys", role="system" -%}
You are {{ persona }}. Reply in one line.
{%- endsegment %}
{% for h in history %}
  {%- segment "fixed", id="h" ~ loop.index0, role="user" %}{{ h }}{% endsegment %}
{% endfor %}
{% segment "update", id="obs", role="tool" %}{{ observation }}{% endsegment %}
"""
PERSONA = "a build bot that watches CI logs and files short, precise failure reports"
PARAMS = GenerationParams(max_new_tokens=6)


def make_engine(model: LoadedModel) -> Engine:
    return Engine(model, EngineConfig(strategy="prefix", kv_pages=256))


def template() -> PromptTemplate[TurnInputs]:
    return PromptTemplate(TEMPLATE, TurnInputs, name="agent")


def test_session_renders_dict_inputs_with_template(tiny: LoadedModel) -> None:
    session = AgentSession(make_engine(tiny), template(), strategy="full", params=PARAMS)
    inputs = {"persona": PERSONA, "history": ["build 1 ok"], "observation": "build 2 failed"}
    prompt = session.prompt_for(inputs)
    assert [s.id for s in prompt.segments] == ["sys", "h0", "obs"]
    assert prompt.segments[2] == Segment(SegmentKind.UPDATE, "build 2 failed", "obs", "tool")
    assert session.prompt_for(TurnInputs(**inputs)) == prompt  # type: ignore[arg-type]
    out = session.turn(inputs)
    ref = make_engine(tiny).generate(prompt, PARAMS, strategy="full")
    assert out.token_ids == ref.token_ids and out.text == ref.text
    assert out.stats.prompt_tokens == ref.stats.prompt_tokens
    assert session.turns == [out]


def test_session_template_validation_errors_surface(tiny: LoadedModel) -> None:
    from pydantic import ValidationError

    session = AgentSession(make_engine(tiny), template(), strategy="full")
    with pytest.raises(ValidationError, match="observation"):
        session.turn({"persona": PERSONA})
    assert session.turns == []


def test_session_without_template_rejects_inputs(tiny: LoadedModel) -> None:
    session = AgentSession(make_engine(tiny), strategy="full", params=PARAMS)
    with pytest.raises(PromptError, match="no template"):
        session.turn({"persona": PERSONA, "observation": "x"})
    with pytest.raises(PromptError, match="no template"):
        session.turn(TurnInputs(persona=PERSONA, observation="x"))
    assert session.turns == []
    # raw segments and prompts still work
    segs = [Segment(SegmentKind.UPDATE, "ping", "u", "user")]
    a = session.turn(segs)
    b = session.turn(SegmentedPrompt(segs))
    assert a.token_ids == b.token_ids
    assert len(session.turns) == 2


def test_session_rejects_a_bare_string_and_keeps_working(tiny: LoadedModel) -> None:
    session = AgentSession(make_engine(tiny), strategy="full", params=PARAMS)
    with pytest.raises(PromptError, match="sequence of Segments, got str"):
        session.turn("ping")  # type: ignore[arg-type]
    assert session.turns == []
    session.turn([Segment(SegmentKind.UPDATE, "ping", "u", "user")])
    assert len(session.turns) == 1


def test_session_on_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'nosuchbackend'; known: embedded, vllm"):
        AgentSession.create("nosuchbackend")


def test_session_unknown_strategy_fails_fast(tiny: LoadedModel) -> None:
    with pytest.raises(UnknownStrategyError, match="'nope'"):
        AgentSession(make_engine(tiny), strategy="nope")


def test_session_params_of_another_type_fail_when_the_session_is_made(tiny: LoadedModel) -> None:
    with pytest.raises(ConfigError, match="params must be a GenerationParams, got dict"):
        AgentSession(Engine(tiny), params={"max_new_tokens": 8})  # type: ignore[arg-type]


def test_session_default_strategy_is_the_engines(tiny: LoadedModel) -> None:
    session = AgentSession(make_engine(tiny))
    assert session.strategy == "prefix"
    assert session.params == GenerationParams()


@pytest.mark.parametrize("strategy", ["full", "prefix"])
def test_turn_stats_consistent(tiny: LoadedModel, strategy: str) -> None:
    engine = make_engine(tiny)
    session = AgentSession(engine, template(), strategy=strategy, params=PARAMS)
    history: list[str] = []
    for i, obs in enumerate(["step 1: compile ok", "step 2: tests fail", "step 3: retry"]):
        inputs = TurnInputs(persona=PERSONA, history=list(history), observation=obs)
        out = session.turn(inputs)
        s = out.stats
        assert s.strategy == strategy
        assert s.prompt_tokens == engine.tokenize(session.prompt_for(inputs)).num_tokens
        assert s.reused_tokens + s.recomputed_tokens == s.prompt_tokens
        assert s.recompute_fraction == pytest.approx(s.recomputed_tokens / s.prompt_tokens)
        assert 0.0 < s.recompute_fraction <= 1.0
        assert s.decode_tokens == len(out.token_ids)
        assert s.ttft_s > 0.0 and s.decode_tokens_per_s >= 0.0
        assert s.fallbacks == len(s.fallback_reasons) == 0
        if strategy == "full" or i == 0:
            assert s.reused_tokens == 0 and s.recompute_fraction == 1.0
        else:
            assert s.reused_tokens >= 16
        history.append(obs + " -> " + out.text)
    assert len(session.turns) == 3


SESSIONS = 4
TURNS = 3


def observations(k: int) -> list[str]:
    return [f"job {k}.{t}: exit code {k * 7 + t}" for t in range(TURNS)]


def run_session(session: AgentSession, k: int, barrier: threading.Barrier | None) -> list[str]:
    history: list[str] = []
    for obs in observations(k):
        if barrier is not None:
            barrier.wait(timeout=60)
        out = session.turn({"persona": PERSONA, "history": history, "observation": obs})
        history = [*history, obs, out.text]
    return history


def outputs(session: AgentSession) -> list[tuple[int, ...]]:
    return [g.token_ids for g in session.turns]


def test_sessions_in_threads_match_serial(tiny: LoadedModel) -> None:
    shared = make_engine(tiny)
    threaded = [AgentSession(shared, template(), params=PARAMS) for _ in range(SESSIONS)]
    barrier = threading.Barrier(SESSIONS)
    errors: list[BaseException] = []
    histories: dict[int, list[str]] = {}

    def worker(k: int) -> None:
        try:
            histories[k] = run_session(threaded[k], k, barrier)
        except BaseException as e:  # surfaced below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)

    fresh = make_engine(tiny)
    serial = [AgentSession(fresh, template(), params=PARAMS) for _ in range(SESSIONS)]
    for k in range(SESSIONS):
        assert run_session(serial[k], k, None) == histories[k]
        assert outputs(serial[k]) == outputs(threaded[k])
        assert [g.text for g in serial[k].turns] == [g.text for g in threaded[k].turns]
    # the sessions really shared the engine's store: later turns reused earlier KV
    turns: list[Generation] = [g for s in threaded for g in s.turns]
    assert len(turns) == SESSIONS * TURNS
    assert shared.store.stats.hits > 0
    assert sum(g.stats.reused_tokens > 0 for g in turns) >= SESSIONS * (TURNS - 1)
    assert shared.ctx.pool.num_free == 256  # every sequence was freed


def test_session_passes_the_reply_form_to_the_engine(tiny: LoadedModel) -> None:
    session = AgentSession(make_engine(tiny))
    prompt = [Segment(SegmentKind.SYSTEM, "sys", "s", "system"), Segment(SegmentKind.UPDATE, "hi")]
    seen: list[str] = []

    def reply(text: str) -> None:
        seen.append(text)

    out = session.turn(prompt, GenerationParams(max_new_tokens=3), reply=reply)
    assert seen == [out.text] and out.stats.reply_kv == "no-reply"
    assert session.turn(prompt, GenerationParams(max_new_tokens=3)).stats.reply_kv is None
