"""A Reflexion loop (Shinn et al., 2023): ReAct trials, an exact-match evaluator, and a verbal
reflection after each failed trial that the next trials read.

Per trial, each step is one model call that continues "Thought n:" and must write
"Action n: Search[...] | Lookup[...] | Finish[...]". An output with no action is replaced by a
fallback action (counted): Search[<question>] while steps remain, Finish[<last observation>]
on the last step. A failed trial asks for a reflection (one more call); an empty one is
replaced by a fixed diagnosis (counted).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from agentcache import Engine
from agentcache_agents.loop import AgentLoop
from agentcache_agents.wiki import KnowledgeBase
from agentcache_templates import ReflexionInputs, Step

ACTION = re.compile(r"Action\s*\d*\s*:\s*(Search|Lookup|Finish)\[([^\]\n]*)\]", re.IGNORECASE)
REFLECT_ASK = (
    "You were unsuccessful in answering the question: {verdict} In a few sentences, diagnose a "
    "possible reason for failure and devise a new, concise, high level plan that aims to "
    "mitigate the same failure."
)


@dataclass(frozen=True)
class QATask:
    question: str
    answer: str
    passages: dict[str, str]


@dataclass(frozen=True)
class TrialResult:
    trial: int
    answer: str | None  # what Finish[...] returned; None if the trial ran out of steps
    correct: bool
    steps: int


def normalize(answer: str) -> str:
    text = answer.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(w for w in text.split() if w not in {"a", "an", "the"})


def parse_action(text: str) -> tuple[str, str] | None:
    """The first `Action: Kind[argument]` in a model output, or None."""
    m = ACTION.search(text)
    return (m.group(1).capitalize(), m.group(2).strip()) if m else None


def thought_of(text: str) -> str:
    """The model's thought: its output up to the action line, on one line."""
    head = re.split(r"\n?\s*Action\s*\d*\s*:", text, maxsplit=1)[0]
    return " ".join(head.split())[:300]


class ReflexionAgent(AgentLoop):
    template_name = "reflexion"

    def __init__(
        self,
        engine: Engine,
        examples: list[str] | None = None,
        max_trials: int = 3,
        max_steps: int = 4,
        strategy: str | None = None,
        max_new_tokens: int = 48,
    ) -> None:
        super().__init__(engine, strategy, max_new_tokens)
        self.examples = examples or []
        self.max_trials = max_trials
        self.max_steps = max_steps
        self.reflections: list[str] = []

    def run(self, task: QATask) -> list[TrialResult]:
        """Trials until one is correct or `max_trials` ran; reflections carry across trials."""
        results: list[TrialResult] = []
        for trial in range(1, self.max_trials + 1):
            result, steps = self._trial(task, trial)
            results.append(result)
            if result.correct:
                break
            if trial < self.max_trials:
                self.reflections.append(self._reflect(task, trial, steps, result))
        return results

    def _inputs(self, task: QATask, trial: int, steps: list[Step], **kw: object) -> ReflexionInputs:
        return ReflexionInputs.model_validate(
            dict(
                examples=self.examples, trial=trial, max_trials=self.max_trials,
                steps_left=self.max_steps - len(steps), reflections=list(self.reflections),
                question=task.question, scratchpad=steps[:-1], latest=steps[-1] if steps else None,
                **kw,
            )
        )  # fmt: skip

    def _trial(self, task: QATask, trial: int) -> tuple[TrialResult, list[Step]]:
        kb = KnowledgeBase(task.passages)
        steps: list[Step] = []
        for n in range(1, self.max_steps + 1):
            prefix = f"Thought {n}:"
            inputs = self._inputs(task, trial, steps, reply_prefix=prefix)
            text = self.generate(inputs, "act", stop=("\nObservation", f"\nThought {n + 1}"))
            action = parse_action(text)
            if action is None:
                self.fall_back("no action parsed")
                last = steps[-1].observation if steps else ""
                action = ("Finish", last[:60]) if n == self.max_steps else ("Search", task.question)
            kind, arg = action
            act_text = f"{prefix} {thought_of(text)}\nAction {n}: {kind}[{arg}]"
            if kind == "Finish":
                correct = normalize(arg) == normalize(task.answer)
                steps.append(Step(action=act_text, observation="Episode finished."))
                return TrialResult(trial, arg, correct, n), steps
            obs = kb.search(arg) if kind == "Search" else kb.lookup(arg)
            steps.append(Step(action=act_text, observation=obs))
        return TrialResult(trial, None, False, self.max_steps), steps

    def _reflect(self, task: QATask, trial: int, steps: list[Step], result: TrialResult) -> str:
        if result.answer is None:
            verdict = f"you ran out of steps after {result.steps} actions without calling Finish."
        else:
            verdict = f"your answer {result.answer!r} was wrong."
        feedback = REFLECT_ASK.format(verdict=verdict)
        inputs = self._inputs(task, trial, steps, feedback=feedback, reply_prefix="Reflection:")
        text = self.generate(inputs, "reflect", stop=("\n\n",), max_new_tokens=64)
        reflection = " ".join(text.split())[:400]
        if sum(c.isalpha() for c in reflection) < 10:
            self.fall_back("empty reflection")
            reflection = (
                f"Trial {trial} failed: {verdict} Next time I will search the entities of the "
                "question one hop at a time and finish with the exact answer."
            )
        return reflection
