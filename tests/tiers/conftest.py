from __future__ import annotations

from agentcache.prompt.segments import Segment, SegmentedPrompt, SegmentKind

SYSTEM = "You are a careful agent. Use the memory blocks and answer briefly. " * 2
MEMORY = (
    "Memory A: the build failed in module parser with a missing import of Token. " * 2,
    "Memory B: tests under tests/unit pass; the integration suite times out at step 4. " * 2,
)


def agent_turn(turn: int, session: int = 0) -> SegmentedPrompt:
    """[system][update of varying length][fixed A][fixed B][update]: A and B shift each turn."""
    note = f"Session {session} step {turn}: " + "observation text " * (1 + (turn * 7) % 5)
    return SegmentedPrompt([
        Segment(SegmentKind.SYSTEM, SYSTEM, "sys", "system"),
        Segment(SegmentKind.UPDATE, note, "note", "user"),
        Segment(SegmentKind.FIXED, MEMORY[0] + f" (s{session})", "memA", "user"),
        Segment(SegmentKind.FIXED, MEMORY[1] + f" (s{session})", "memB", "user"),
        Segment(SegmentKind.UPDATE, f"What next after step {turn}? The next", "q", "user"),
    ])  # fmt: skip
