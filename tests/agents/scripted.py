from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentcache.runtime.engine import Generation
from agentcache.session import AgentSession
from agentcache_agents import AgentLoop


class ScriptedSession(AgentSession):
    """Runs every turn on the real engine (so stats are real), then hands the loop a scripted
    output instead of the tiny model's random bytes: the loops' success paths under test."""

    def __init__(self, base: AgentSession, script: list[str]) -> None:
        super().__init__(base.engine, base.template, base.strategy, base.params)
        self.script = list(script)

    def turn(self, inputs: Any, params: Any = None) -> Generation:
        out = super().turn(inputs, params)
        return replace(out, text=self.script.pop(0))


def script(loop: AgentLoop, outputs: list[str]) -> ScriptedSession:
    loop.session = ScriptedSession(loop.session, outputs)
    return loop.session
