"""A few agent turns under every registered reuse strategy, reduced to what must not change:
generated ids, finish reasons, and how many prompt tokens each turn reused and recomputed.

`python -m tests.reuse.recorded_strategies`, from the repository root, writes the record
(`recorded_strategies.json`) that `test_recorded_strategies.py` holds the engine to; it was
written before the segment store became an interface with the tiered and folder stores
composed around it. The `rpdc` entries were written again when its default gained `cover=1.5`
(every strategy else unchanged; its replies now equal `full`'s on these turns). The reuse
counts were written again when an update's opening shared with a segment stored after the same
context (its head) became found: reused and recomputed counts only, every id and finish reason
unchanged. The `plan` entries were written again when the planner began to count those heads
in its plans' costs (it now takes `exact` where it took `prefix`): counts only, as above. The
`rpdc` counts were written again when its default gained `cover_min=256` (its third turn's 41
moved tokens now all computed: counts only, every id and finish reason unchanged).

Layout per turn: [system][memory: update, its length changes][history: fixed, shifted][user],
the shape where position-independent reuse differs from prefix reuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.reuse.base import STRATEGIES
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from tests.records import write_record

RECORD = Path(__file__).with_name("recorded_strategies.json")
SYSTEM = (
    "You are the planning agent of a small bookshop. You keep stock lists, answer customers "
    "and order books from two wholesalers; orders over forty euros ship free. "
) * 3
MEMORY = ("Stock: 3 atlases.", "Stock: 3 atlases, 12 novels, 1 dictionary on order.",
          "Stock: 2 atlases.")  # fmt: skip
QUESTIONS = ("Which wholesaler is cheaper?", "Order two novels.", "What ships free?")
STATS = ("prompt_tokens", "reused_tokens", "recomputed_tokens", "fallbacks", "reply_kv")


def run_turns(model: LoadedModel) -> dict[str, list[dict[str, Any]]]:
    """Per strategy, the turns of one conversation (each reply stored for the next)."""
    return {name: _conversation(model, name) for name in STRATEGIES.names()}


def _conversation(model: LoadedModel, strategy: str) -> list[dict[str, Any]]:
    engine = Engine(model, EngineConfig(strategy=strategy, kv_pages=256))
    history: list[Segment] = []
    turns = []
    for i, (memory, question) in enumerate(zip(MEMORY, QUESTIONS, strict=True)):
        prompt = SegmentedPrompt([
            Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system"),
            Segment(SegmentKind.UPDATE, memory, "memory", "user"),
            *history,
            Segment(SegmentKind.UPDATE, question, f"u{i}", "user"),
        ])  # fmt: skip

        def reply(text: str, sid: str = f"a{i}") -> Segment:
            return Segment(SegmentKind.FIXED, text, sid, "assistant")

        gen = engine.generate(prompt, GenerationParams(max_new_tokens=8), reply=reply)
        s = gen.stats
        turns.append({
            "ids": list(gen.token_ids), "finish": gen.finish_reason,
            **{n: v if isinstance(v := getattr(s, n), bool | int) or v is None else str(v)
               for n in STATS},
        })  # fmt: skip
        history += [Segment(SegmentKind.FIXED, question, f"u{i}", "user"), reply(gen.text)]
    return turns


if __name__ == "__main__":
    write_record(RECORD, run_turns)
