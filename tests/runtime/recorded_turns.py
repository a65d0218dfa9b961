"""A few chat turns under dense, sparse and verified decode, reduced to what must not change:
token ids, finish reasons, text and the stats that matter.

`python -m tests.runtime.recorded_turns`, from the repository root, writes the record
(`recorded_turns.json`) that `test_recorded_turns.py` holds the engine to; it was written by
the engine before its decode loop became the `Decoder` seam.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentcache.decode.config import DecodeConfig
from agentcache.model.loading import LoadedModel
from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind
from agentcache.runtime.engine import Engine, EngineConfig, GenerationParams
from tests.records import write_record

RECORD = Path(__file__).with_name("recorded_turns.json")
SYSTEM = (
    "You are a careful assistant for a small library. Members borrow books for three weeks, "
    "may renew twice, and pay no fines; the reading room opens at nine and closes at six. "
) * 6
QUESTIONS = ("When does the reading room open?", "How long may I keep a book?", "Any fines?")
# dense; sparse (2 pages of top-K, so pages are dropped); the same, verified
POLICIES = ("dense", "quest:budget=2", "quest:budget=2:verify=4")
# greedy; greedy with a stop string; sampled
PARAMS = (
    GenerationParams(max_new_tokens=12),
    GenerationParams(max_new_tokens=12, stop=("ns at", " 12")),
    GenerationParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7),
)
STATS = (
    "prompt_tokens", "reused_tokens", "recomputed_tokens", "decode_tokens", "decode_policy",
    "decode_fallbacks", "fallbacks", "reply_kv",
)  # fmt: skip
DECODE_STATS = (
    "steps", "head_reranks", "pages_promoted", "initial_pages_promoted", "budget_pages",
    "budget_clamped", "verify_passes", "drafted_tokens", "accepted_tokens", "verify_skipped",
    "selected_pages",
)  # fmt: skip


def run_turns(model: LoadedModel) -> dict[str, list[dict[str, Any]]]:
    """Per decode policy, the turns of one conversation (each reply stored for the next)."""
    return {spec: _conversation(model, spec) for spec in POLICIES}


def _conversation(model: LoadedModel, spec: str) -> list[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # budget clamping on short contexts
        config = EngineConfig(kv_pages=256, decode=DecodeConfig.from_spec(spec))
        engine = Engine(model, config)
        system = Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system")
        segments = [system]
        turns = []
        for i, (question, params) in enumerate(zip(QUESTIONS, PARAMS, strict=True)):
            segments.append(Segment(SegmentKind.UPDATE, question, f"u{i}", "user"))
            reply_id = f"a{i}"

            def reply(text: str, sid: str = reply_id) -> Segment:
                return Segment(SegmentKind.FIXED, text, sid, "assistant")

            gen = engine.generate(SegmentedPrompt(segments), params, reply=reply)
            turns.append(_record(gen))
            segments[-1] = Segment(SegmentKind.FIXED, question, f"u{i}", "user")
            segments.append(reply(gen.text))
    return turns


def _record(gen: Any) -> dict[str, Any]:
    s = gen.stats
    record = {
        "ids": list(gen.token_ids), "finish": gen.finish_reason, "text": gen.text,
        **{name: _plain(getattr(s, name)) for name in STATS},
    }  # fmt: skip
    if s.decode is not None:
        record["decode"] = {name: asdict(s.decode)[name] for name in DECODE_STATS}
    return record


def _plain(value: Any) -> Any:
    return None if value is None else value if isinstance(value, bool | int) else str(value)


if __name__ == "__main__":
    write_record(RECORD, run_turns)
