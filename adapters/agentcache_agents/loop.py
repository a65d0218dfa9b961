"""What every agent loop shares: turns through an `AgentSession` on a shipped template, one
record per model call (reuse and TTFT), and counted fallbacks for outputs that did not parse."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from pydantic import BaseModel

from agentcache import AgentSession, Engine, GenerationParams, load_template
from agentcache.reuse.base import SegmentMiss


@dataclass(frozen=True)
class TurnRecord:
    """One model call of an agent loop."""

    index: int
    purpose: str  # what the call was for: "act", "reflect", "reply", "summarise"
    prompt_tokens: int
    reused_tokens: int
    recomputed_tokens: int
    ttft_s: float
    text: str  # the model's output, as generated
    misses: tuple[SegmentMiss, ...] = ()  # system/fixed segments not found, and why
    fallback: str | None = None  # why the output was replaced by a fallback, if it was


class AgentLoop:
    """Base of the agent loops. Subclasses set `template_name` and call `generate` per model
    call; when an output cannot be used they call `fall_back(reason)` and act on a fallback,
    so every replaced output is counted (`fallbacks`) and marked on its record."""

    template_name = ""

    def __init__(
        self, engine: Engine, strategy: str | None = None, max_new_tokens: int = 48
    ) -> None:
        self.session = AgentSession(engine, load_template(self.template_name), strategy)
        self.max_new_tokens = max_new_tokens
        self.records: list[TurnRecord] = []
        self.fallbacks: Counter[str] = Counter()

    def generate(
        self, inputs: BaseModel, purpose: str, stop: tuple[str, ...] = (), max_new_tokens: int = 0
    ) -> str:
        params = GenerationParams(max_new_tokens=max_new_tokens or self.max_new_tokens, stop=stop)
        out = self.session.turn(inputs, params)
        s = out.stats
        record = TurnRecord(
            len(self.records), purpose, s.prompt_tokens, s.reused_tokens, s.recomputed_tokens,
            s.ttft_s, out.text, s.misses,
        )  # fmt: skip
        self.records.append(record)
        return out.text

    def fall_back(self, reason: str) -> None:
        """Count a fallback for the latest model call."""
        self.fallbacks[reason] += 1
        self.records[-1] = replace(self.records[-1], fallback=reason)

    @property
    def num_fallbacks(self) -> int:
        return sum(self.fallbacks.values())
