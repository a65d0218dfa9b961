"""A SWE-agent / mini-swe-agent style tool loop: THOUGHT + one bash command per step, run in an
offline `Workspace`, its output shown as the next observation, until `submit` or the step limit.

An output with no command (no ```bash block and no line starting with a known command) is
replaced by the next command of a fixed exploration plan (ls, cat the task's file, pytest,
submit) and counted as a fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentcache import Engine
from agentcache_agents.loop import AgentLoop
from agentcache_agents.shell import TOOL_DOCS, Check, Workspace
from agentcache_templates import Step, SWEAgentInputs, ToolDoc

FENCE = re.compile(r"```(?:bash|sh)?[ \t]*\n(.*?)(?:\n```|$)", re.DOTALL)
COMMANDS = ("ls", "cd", "pwd", "cat", "grep", "sed", "echo", "pytest", "submit")


@dataclass(frozen=True)
class SWETask:
    description: str
    files: dict[str, str]
    check: Check
    focus_file: str = ""  # the file a fallback plan opens


@dataclass(frozen=True)
class SWEResult:
    submitted: bool
    passed: bool
    steps: int
    trajectory: tuple[Step, ...]  # the executed actions (normalised) and their outputs


def parse_command(text: str) -> str | None:
    """The command of the first ```bash block, else the first line that starts with a known
    command; only its first line."""
    m = FENCE.search(text)
    if m is not None:
        line = m.group(1).strip().splitlines()[0].strip() if m.group(1).strip() else ""
        return line or None
    for line in text.splitlines():
        line = line.strip().lstrip("$ ").strip()
        if line.split(" ")[0] in COMMANDS:
            return line
    return None


def thought_of(text: str) -> str:
    head = text.split("```", 1)[0]
    return " ".join(head.split())[:300]


class SWEAgent(AgentLoop):
    template_name = "swe_agent"

    def __init__(
        self,
        engine: Engine,
        max_steps: int = 8,
        strategy: str | None = None,
        max_new_tokens: int = 48,
    ) -> None:
        super().__init__(engine, strategy, max_new_tokens)
        self.max_steps = max_steps
        self.tools = [ToolDoc(signature=s, docstring=d) for s, d in TOOL_DOCS]

    def fallback_plan(self, task: SWETask) -> list[str]:
        focus = task.focus_file or sorted(task.files)[0]
        return ["ls", f"cat {focus}", "pytest", "submit"]

    def run(self, task: SWETask) -> SWEResult:
        ws = Workspace(task.files, task.check)
        plan, planned = self.fallback_plan(task), 0
        steps: list[Step] = []
        for n in range(1, self.max_steps + 1):
            inputs = SWEAgentInputs(
                tools=self.tools, task=task.description, working_dir=ws.root, cwd=ws.cwd,
                open_file=ws.open_file, steps_left=self.max_steps - n + 1,
                history=steps[:-1], latest=steps[-1] if steps else None, reply_prefix="THOUGHT:",
            )  # fmt: skip
            text = self.generate(inputs, "act", stop=("\n```\n", "<output>"))
            command = parse_command(text)
            if command is None:
                self.fall_back("no command parsed")
                command, planned = plan[min(planned, len(plan) - 1)], planned + 1
            obs = ws.run(command)
            action = f"THOUGHT: {thought_of(text)}\n```bash\n{command}\n```"
            steps.append(Step(action=action, observation=obs or "(no output)"))
            if ws.submitted:
                break
        passed, _ = task.check(ws.relative())
        return SWEResult(ws.submitted, passed, len(steps), tuple(steps))
