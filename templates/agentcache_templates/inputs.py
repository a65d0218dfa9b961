"""Pydantic input models of the shipped templates: what each template needs, validated at the
user's edge. Unknown fields are rejected, so a misspelt input fails instead of being ignored."""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

REFLEXION_INSTRUCTIONS = (
    "Solve a question answering task with interleaving Thought, Action, Observation steps. "
    "Thought can reason about the current situation, and Action can be three types:\n"
    "(1) Search[entity], which searches the exact entity on the knowledge base and returns the "
    "first paragraph if it exists. If not, it will return some similar entities to search.\n"
    "(2) Lookup[keyword], which returns the next sentence containing keyword in the last "
    "passage successfully found by Search.\n"
    "(3) Finish[answer], which returns the answer and finishes the task.\n"
    "Write exactly one Thought line and one Action line per step."
)
REFLECTIONS_HEADER = (
    "You have attempted to answer the following question before and failed. The following "
    "reflection(s) give a plan to avoid failing to answer the question in the same way you did "
    "previously. Use them to improve your strategy of correctly answering the given question."
)
MEMGPT_INSTRUCTIONS = (
    "You are a MemGPT agent: a persistent conversational companion with a tiered memory.\n"
    "Control flow: you run in short bursts, triggered by user messages and heartbeat events. "
    "Start every burst with a private inner monologue (at most 50 words); the user sees only "
    "what you pass to send_message.\n"
    "Memory: core memory (the blocks below) is always in context; edit it as soon as you learn "
    "something important. Recall memory holds the whole conversation; only the most recent "
    "messages stay in the FIFO queue, older ones are summarised. Archival memory is unlimited "
    "long-term storage.\n"
    'Call functions on their own line as name(argument="value", ...).'
)
MEMGPT_TOOLS = (
    "send_message(message: str): send a message to the user.\n"
    "core_memory_append(label: str, content: str): append content to the core memory block "
    "named label.\n"
    "core_memory_replace(label: str, old_content: str, new_content: str): replace text in a "
    "core memory block.\n"
    "archival_memory_insert(content: str): save content to archival memory."
)
SWE_AGENT_SYSTEM = (
    "You are a helpful assistant that can interact with a computer to solve tasks. You work in "
    "a repository through a shell, one command at a time.\n"
    "Each response is one THOUGHT line that explains your reasoning, then exactly ONE bash code "
    "block with ONE command, for example:\n"
    "THOUGHT: I should first see which files the repository has.\n```bash\nls\n```\n"
    "After each command you get its output as an observation. When the task is done, run "
    "`submit`."
)


class _Inputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_Inputs):
    """One action (the assistant's text) and what the environment answered."""

    action: str = Field(min_length=1)
    observation: str


class ToolDoc(_Inputs):
    signature: str = Field(min_length=1)  # e.g. "grep PATTERN FILE"
    docstring: str


class MemoryBlock(_Inputs):
    """A core-memory block (Letta: label, description, value, character limit)."""

    label: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    value: str
    description: str = ""
    limit: int = Field(default=2000, gt=0)

    @model_validator(mode="after")
    def _fits(self) -> MemoryBlock:
        if len(self.value) > self.limit:
            raise ValueError(
                f"block {self.label!r} holds {len(self.value)} characters, over its limit "
                f"of {self.limit}"
            )
        return self


class Message(_Inputs):
    """One message of the FIFO queue. `index` is its position in the whole conversation, so its
    segment id stays the same when older messages are evicted."""

    index: int = Field(ge=0)
    role: Literal["user", "assistant", "tool"]
    content: str = Field(min_length=1)


class ReflexionInputs(_Inputs):
    instructions: str = Field(default=REFLEXION_INSTRUCTIONS, min_length=1)
    examples: list[str] = []
    trial: int = Field(default=1, ge=1)
    max_trials: int = Field(default=3, ge=1)
    steps_left: int = Field(default=6, ge=0)
    reflections_header: str = REFLECTIONS_HEADER
    reflections: list[str] = []
    question: str = Field(min_length=1)
    scratchpad: list[Step] = []  # steps of this trial already shown: fixed
    latest: Step | None = None  # the step shown for the first time: update
    feedback: str = ""  # the evaluator's verdict, asked to reflect on: update
    reply_prefix: str = ""

    @model_validator(mode="after")
    def _trial_in_range(self) -> ReflexionInputs:
        if self.trial > self.max_trials:
            raise ValueError(f"trial {self.trial} is past max_trials {self.max_trials}")
        return self


class MemGPTInputs(_Inputs):
    instructions: str = Field(default=MEMGPT_INSTRUCTIONS, min_length=1)
    tools: str = MEMGPT_TOOLS
    last_modified: str = Field(min_length=1)
    recall_count: int = Field(default=0, ge=0)
    archival_count: int = Field(default=0, ge=0)
    blocks: list[MemoryBlock] = Field(min_length=1)
    summary: str | None = None  # of the messages evicted from the queue
    summary_upto: int = Field(default=0, ge=0)  # messages [0, summary_upto) are summarised
    history: list[Message] = []  # messages already shown: fixed
    new_messages: list[Message] = []  # shown for the first time: update
    reply_prefix: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> MemGPTInputs:
        labels = [b.label for b in self.blocks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"block labels must be unique, got {labels}")
        indices = [m.index for m in [*self.history, *self.new_messages]]
        if any(b <= a for a, b in itertools.pairwise(indices)):
            raise ValueError(f"message indices must increase, got {indices}")
        if indices and indices[0] < self.summary_upto:
            raise ValueError(
                f"message {indices[0]} is in the queue but summary_upto={self.summary_upto} "
                "says it was summarised"
            )
        return self


class SWEAgentInputs(_Inputs):
    system: str = Field(default=SWE_AGENT_SYSTEM, min_length=1)
    tools: list[ToolDoc] = []
    demonstration: str = ""
    task: str = Field(min_length=1)
    working_dir: str = "/repo"
    cwd: str = "/repo"
    open_file: str | None = None
    steps_left: int = Field(default=10, ge=0)
    history: list[Step] = []  # steps already shown: fixed
    latest: Step | None = None  # the step shown for the first time: update
    reply_prefix: str = ""
