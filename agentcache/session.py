"""AgentSession: one agent conversation on an engine, turn by turn, with per-turn stats."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from agentcache.backends import TurnEngine, create_engine
from agentcache.errors import PromptError
from agentcache.prompt.segments import Segment, SegmentedPrompt
from agentcache.prompt.template import PromptTemplate
from agentcache.reuse import DEFAULT_STRATEGY
from agentcache.runtime.engine import Generation, GenerationParams
from agentcache.runtime.params import turn_params


class AgentSession:
    """Holds a template (or takes raw segments) and an engine: the embedded `Engine` or
    any other `TurnEngine` (e.g. vLLM; see `AgentSession.create(backend=...)`).

    `turn()` renders the turn's inputs, runs it with the session's strategy and returns the
    `Generation` (text + `TurnStats`). Sessions sharing an engine may run in different threads.
    """

    def __init__(
        self,
        engine: TurnEngine,
        template: PromptTemplate[Any] | None = None,
        strategy: str | None = None,
        params: GenerationParams | None = None,
    ) -> None:
        self.engine = engine
        self.template = template
        self.strategy = strategy or engine.config.strategy
        engine.strategy(self.strategy)  # fail fast on unknown names
        self.params = turn_params(params)  # a dict here fails now, not at the first turn
        self.turns: list[Generation] = []

    @classmethod
    def create(
        cls,
        backend: str = "embedded",
        model: str | None = None,
        template: PromptTemplate[Any] | None = None,
        strategy: str | None = None,
        params: GenerationParams | None = None,
        **engine_options: Any,
    ) -> AgentSession:
        """A session on a new engine of `backend` ("embedded" or "vllm")."""
        engine = create_engine(backend, model, strategy or DEFAULT_STRATEGY, **engine_options)
        return cls(engine, template, strategy, params)

    def prompt_for(
        self, inputs: BaseModel | Mapping[str, Any] | SegmentedPrompt | Iterable[Segment]
    ) -> SegmentedPrompt:
        if isinstance(inputs, SegmentedPrompt):
            return inputs
        if isinstance(inputs, BaseModel | Mapping):
            if self.template is None:
                raise PromptError("this session has no template: pass segments, not inputs")
            return self.template.render(inputs)
        return SegmentedPrompt(inputs)

    def turn(
        self,
        inputs: BaseModel | Mapping[str, Any] | SegmentedPrompt | Iterable[Segment],
        params: GenerationParams | None = None,
        reply: Callable[[str], Segment | None] | None = None,
    ) -> Generation:
        """`reply` maps the reply's text to the segment it becomes in later turns' prompts; the
        engine then stores its KV when it generates it (see `Engine.generate`)."""
        result = self.engine.generate(
            self.prompt_for(inputs), params or self.params, self.strategy, reply=reply
        )
        self.turns.append(result)
        return result
