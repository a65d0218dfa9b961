"""Ratios paired within a round: one configuration's TTFT over another's on the same turn
measured in the same round, and the spread of those ratios.

A round runs every configuration once, each in its own process, back to back; so a ratio
pairs two measurements minutes apart, never two from separate rounds (or separate runs, whose
conditions on a shared machine can differ more than the configurations do).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PAIRING = (
    "each ratio pairs turns of the same round; configurations in separate processes, "
    "run back to back in rotated order"
)

TurnKey = tuple[str, int, int]  # (session, turn, round)


def turn_key(record: dict[str, Any]) -> TurnKey:
    """The measured turn a record is of. Records without a round come from one-round runs."""
    return (record["session"], record["turn"], record.get("round", 0))


def paired_ratios(records: Iterable[dict[str, Any]], config: str, base: str) -> list[float]:
    """Per warm turn (every turn but a session's first) of `config`, in record order: its TTFT
    over `base`'s on the same turn of the same round. Raises KeyError when `base` lacks one."""
    rows = list(records)
    theirs = {turn_key(r): r["ttft_ms"] for r in rows if r["config"] == base}
    return [
        r["ttft_ms"] / theirs[turn_key(r)] for r in rows if r["config"] == config and r["turn"] > 0
    ]
