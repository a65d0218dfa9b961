"""A MemGPT-style memory agent (Packer et al., 2023; Letta): core-memory blocks edited through
function calls parsed from the model's output, a FIFO message queue, and a recursive summary
of the messages evicted when the queue overflows.

One user message starts a burst: the model may call a core-memory function (applied, answered
with a tool message, and followed by a heartbeat call) and must end with
send_message(message="..."). Bounded by `max_heartbeats`. An output with no known call is sent
to the user as it is (counted fallback); a burst that never calls send_message ends silently
(counted). When the queue holds more than `max_queue_tokens` tokens, its oldest messages are
evicted and the model summarises them (an empty summary falls back to their first lines,
counted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentcache import Engine
from agentcache_agents.calls import Call, parse_calls
from agentcache_agents.loop import AgentLoop
from agentcache_templates import MemGPTInputs, MemoryBlock, Message

EDITS = {"core_memory_append", "core_memory_replace", "archival_memory_insert"}
FUNCTIONS = EDITS | {"send_message"}
START = datetime(2026, 1, 5, 9, 0)  # a fixed clock keeps runs reproducible
SUMMARISE = (
    "[system alert] The message queue is full. Summarise the conversation so far in at most "
    "three sentences, keeping every fact about the user."
)


@dataclass(frozen=True)
class BlockSpec:
    label: str
    value: str
    description: str = ""
    limit: int = 2000


class MemGPTAgent(AgentLoop):
    template_name = "memgpt"

    def __init__(
        self,
        engine: Engine,
        blocks: list[BlockSpec],
        max_queue_tokens: int = 600,
        max_heartbeats: int = 2,
        strategy: str | None = None,
        max_new_tokens: int = 48,
    ) -> None:
        super().__init__(engine, strategy, max_new_tokens)
        self.blocks = {b.label: b for b in blocks}
        self.max_queue_tokens = max_queue_tokens
        self.max_heartbeats = max_heartbeats
        self.queue: list[Message] = []  # shown in earlier calls: fixed segments
        self.fresh: list[Message] = []  # not shown yet: update segments
        self.archival: list[str] = []
        self.summary: str | None = None
        self.summary_upto = 0
        self.num_messages = 0
        self.num_summaries = 0
        self._tokenizer = engine.model.tokenizer

    # ---------------------------------------------------------------- state
    def now(self) -> str:
        return (START + timedelta(minutes=self.num_messages)).strftime("%Y-%m-%d %I:%M:%S %p")

    def add(self, role: str, content: str) -> None:
        msg = Message.model_validate({"index": self.num_messages, "role": role, "content": content})
        self.fresh.append(msg)
        self.num_messages += 1

    def inputs(self, extra: list[Message] | None = None, reply_prefix: str = "") -> MemGPTInputs:
        blocks = [
            MemoryBlock(label=b.label, value=b.value, description=b.description, limit=b.limit)
            for b in self.blocks.values()
        ]
        return MemGPTInputs(
            last_modified=self.now(), recall_count=self.num_messages,
            archival_count=len(self.archival), blocks=blocks, summary=self.summary,
            summary_upto=self.summary_upto, history=list(self.queue),
            new_messages=[*self.fresh, *(extra or [])], reply_prefix=reply_prefix,
        )  # fmt: skip

    def _shown(self) -> None:
        """What the model has seen becomes history: fixed from the next call on."""
        self.queue += self.fresh
        self.fresh = []

    # ---------------------------------------------------------------- loop
    def chat(self, user_text: str) -> str:
        """One user message -> one burst of calls; returns what was sent to the user."""
        self.add(
            "user", json.dumps({"type": "user_message", "message": user_text, "time": self.now()})
        )
        reply = self._burst()
        if self._queue_tokens() > self.max_queue_tokens:
            self._summarise()
        return reply

    def _burst(self) -> str:
        for _ in range(self.max_heartbeats + 1):
            text = self.generate(self.inputs(), "reply")
            self._shown()
            calls = parse_calls(text, FUNCTIONS)
            if not calls:
                self.fall_back("no function call parsed")
                calls = [Call("send_message", {"message": " ".join(text.split()) or "..."})]
            call = calls[0]
            self.add("assistant", call.render())
            if call.name == "send_message":
                return str(call.args.get("message", ""))
            status = self.apply(call)
            self.add("tool", json.dumps({"status": status, "time": self.now()}))
        self.fall_back("no send_message within the heartbeats")
        return ""

    def apply(self, call: Call) -> str:
        """Run a memory function; its errors go back to the model as the tool's answer."""
        a = call.args
        if call.name == "archival_memory_insert":
            self.archival.append(str(a.get("content", "")))
            return "OK"
        label = str(a.get("label", ""))
        if label not in self.blocks:
            return f"Error: no core memory block {label!r}; blocks: {sorted(self.blocks)}"
        block = self.blocks[label]
        if call.name == "core_memory_append":
            value = (block.value + "\n" + str(a.get("content", ""))).strip()
        else:
            old, new = str(a.get("old_content", "")), str(a.get("new_content", ""))
            if not old or old not in block.value:
                return f"Error: {old!r} is not in block {label!r}"
            value = block.value.replace(old, new, 1)
        if len(value) > block.limit:
            return f"Error: block {label!r} would hold {len(value)} characters, over {block.limit}"
        self.blocks[label] = BlockSpec(label, value, block.description, block.limit)
        return "OK"

    # ---------------------------------------------------------------- overflow
    def _queue_tokens(self) -> int:
        return sum(len(self._tokenizer.encode(m.content)) for m in self.queue + self.fresh)

    def _summarise(self) -> None:
        """Evict the oldest half of the queue's tokens and fold them into the summary."""
        budget, evicted, cut = self._queue_tokens() // 2, 0, 0
        while cut < len(self.queue) - 1 and evicted < budget:
            evicted += len(self._tokenizer.encode(self.queue[cut].content))
            cut += 1
        if cut == 0:
            return
        gone = self.queue[:cut]
        alert = Message(index=self.num_messages, role="user", content=SUMMARISE)  # not kept
        inputs = self.inputs([alert], reply_prefix="Summary:")
        text = self.generate(inputs, "summarise", stop=("\n\n",), max_new_tokens=64)
        self._shown()
        summary = " ".join(text.split())  # it read the earlier summary: it replaces it
        if sum(c.isalpha() for c in summary) < 10:
            self.fall_back("empty summary")
            lines = " / ".join(m.content[:60] for m in gone)
            summary = f"{self.summary}\n{lines}" if self.summary else lines
        self.summary = summary
        self.queue = self.queue[cut:]
        self.summary_upto = self.queue[0].index
        self.num_summaries += 1
